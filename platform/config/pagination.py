"""Pagination of the API's list endpoints."""

from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    """``?page=<n>&page_size=<n>``; responses are ``{count, next, previous, results}``."""

    page_size_query_param = "page_size"
    max_page_size = 200
