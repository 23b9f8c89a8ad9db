"""API of run logs: pages of a run's lines, and all of them as text."""

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.selectors import run_get_for_user

from .selectors import RunLogFilters, run_log_lines, run_log_loggers, run_log_page, run_log_state
from .serializers import (
    RunLogLineSerializer,
    RunLogLoggerSerializer,
    RunLogPageSerializer,
    RunLogQuerySerializer,
)
from .text import run_log_text

# Lines read from the database at a time while a download streams.
DOWNLOAD_CHUNK_LINES = 2000


@extend_schema(tags=["runs"])
class RunLogListView(APIView):
    """``?after=&level=&process=&q=&hide=&limit=``: the run's log lines, by cursor; without one, the newest."""

    reads_query_parameters = True

    @extend_schema(
        summary="Read a run's log",
        description="Lines its trainer and producers logged, oldest first: those after the line id `after` "
        "(follow `next_after` for newer ones), else the newest `limit` (before `before`, to scroll back). "
        "Filters: the lowest `level`, a `process` (role or `hostname:pid`), text `q` and loggers to `hide`.",
        parameters=[RunLogQuerySerializer],
        responses={200: RunLogPageSerializer},
    )
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        query = RunLogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        filters = RunLogFilters(level=params.get("level"), process=params.get("process", ""),
                                text=params.get("q", ""), hidden_loggers=tuple(params.get("hide", ())))
        page = run_log_page(run=run, filters=filters, after=params.get("after"), before=params.get("before"),
                            limit=params["limit"])
        next_after = page.lines[-1].pk if page.lines else params.get("after")
        return Response({
            "run": run.pk,
            "lines": RunLogLineSerializer(page.lines, many=True).data,
            "next_after": next_after,
            "has_more": page.has_more,
            "lines_kept": page.lines_kept,
            "lines_deleted": page.lines_deleted,
            "lines_lost": page.lines_lost,
        })


@extend_schema(tags=["runs"])
class RunLogDownloadView(APIView):
    """Every line of the run's log the platform keeps, as text."""

    @extend_schema(
        summary="Download a run's log",
        description="Every kept line, oldest first, as plain text (one line per record, tracebacks "
        "indented below theirs); a first line says how many older lines the cap deleted.",
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        state = run_log_state(run=run)
        lines = run_log_lines(run=run, filters=RunLogFilters()).iterator(chunk_size=DOWNLOAD_CHUNK_LINES)
        response = StreamingHttpResponse(run_log_text(run_id=run.pk, state=state, lines=lines),
                                         content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-logs.txt"'
        return response


@extend_schema(tags=["runs"])
class RunLogLoggerListView(APIView):
    """The loggers of a run's log, with their line counts: what the Logs panel offers to hide."""

    @extend_schema(summary="A run's loggers", responses={200: RunLogLoggerSerializer(many=True)})
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(RunLogLoggerSerializer(run_log_loggers(run=run), many=True).data)
