"""The paged lists of one run's records (checkpoints, evaluations, traces, trajectories): one view, many apps.

The apps that build on runs list their records under ``/api/runs/<run_id>/``
the same way: the run must be one the user can see (another project's run is
a 404, as if it did not exist), and the records come a page at a time
(``common.pagination``). :class:`RunSubListView` does that once; a subclass
names its model, its serializer and its app's list selector.
"""

from collections.abc import Callable

from django.db.models import QuerySet
from rest_framework.generics import ListAPIView

from common.pagination import PageNumberPagination

from .selectors import run_get_for_user


class RunSubListView(ListAPIView):
    """``GET``: one page of a run's records, serialized with ``serializer_class``.

    A subclass sets ``queryset`` (its model's ``objects.none()``: the model,
    for the schema), ``serializer_class`` (given the request in its context),
    and ``run_records``, its app's list selector as
    ``staticmethod(selector)``, called as ``run_records(run=run)`` (or a
    method, where the query string narrows the list, as trajectories' filters
    do). The records are listed as the selector orders them: no filter or
    ``?ordering=`` backends.
    """

    pagination_class = PageNumberPagination
    filter_backends = []
    run_records: Callable[..., QuerySet]

    def get_queryset(self) -> QuerySet:
        run = run_get_for_user(user=self.request.user, run_id=self.kwargs["run_id"])
        return self.run_records(run=run)
