"""Pagination of the API's list endpoints."""

from django.core.paginator import EmptyPage, PageNotAnInteger
from rest_framework import pagination

from common.domain_errors import InvalidInput, NotFound


class PageNumberPagination(pagination.PageNumberPagination):
    """``?page=<n>&page_size=<n>``; responses are ``{count, next, previous, results}``.

    A page that is not a positive integer is a 400 naming ``page``; a page past
    the last is a 404, as DRF has it (the first page always exists, even empty).
    """

    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        paginator = self.django_paginator_class(queryset, self.get_page_size(request))
        number = self.get_page_number(request, paginator)
        try:
            self.page = paginator.page(number)
        except PageNotAnInteger:
            raise InvalidInput.for_field(
                "page", f"Expected a page number, got '{number}'."
            ) from None
        except EmptyPage:
            if int(number) < 1:
                raise InvalidInput.for_field("page", "Pages are numbered from 1.") from None
            raise NotFound(
                f"Page {number} is past the last page ({paginator.num_pages})."
            ) from None
        return list(self.page)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["maximum"] = self.max_page_size
        return parameters
