"""API of telemetry: the charts' backfill, traces on demand, and the trainer's posts."""

import pydantic
from django.http import FileResponse
from rest_framework import status
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from config.pagination import PageNumberPagination
from config.query_params import int_query_param
from domain_errors import InvalidInput, NotFound
from runs.selectors import run_get, run_get_for_user
from tandem.contracts import TelemetryReply, TrainerStepEvent

from .selectors import (
    device_snapshot_get,
    metric_points_after,
    trace_get,
    trace_list,
    trace_requests_pending,
)
from .serializers import TraceRequestSerializer, TraceSerializer, TraceUploadSerializer
from .services import metric_events_record, trace_request, trace_upload

DEFAULT_POINTS_PER_PAGE = 1000
MAX_POINTS_PER_PAGE = 5000
MAX_EVENTS_PER_POST = 1000


class RunMetricsView(APIView):
    """``?after_step=<n>&names=a,b&limit=<n>``: the points after a step cursor, by step."""

    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        after_step = int_query_param(request, "after_step", default=-1)
        limit = int_query_param(request, "limit", default=DEFAULT_POINTS_PER_PAGE)
        limit = min(max(limit, 1), MAX_POINTS_PER_PAGE)
        names = [name for name in request.query_params.get("names", "").split(",") if name]
        page = metric_points_after(run=run, after_step=after_step, names=names, limit=limit)
        points = [{"step": step, "name": name, "value": value} for step, name, value in page.points]
        return Response({"run": run.pk, "points": points, "next_after_step": page.next_after_step})


class NonFiniteJSONParser(JSONParser):
    """Accepts NaN and Infinity, which Python's json writes for a diverged loss."""

    strict = False


class RunDevicesView(APIView):
    """The newest device report of the run's trainer: kind, count, memory, duty cycle, MFU, host."""

    def get(self, request, run_id: int):
        snapshot = device_snapshot_get(run=run_get_for_user(user=request.user, run_id=run_id))
        return Response({"run": run_id, "step": snapshot.step, "recorded_at": snapshot.recorded_at,
                         "report": snapshot.report})


class RunTraceListCreateView(APIView):
    """``GET``: the run's traces, newest first. ``POST {"steps": n}``: trace the trainer's next n steps."""

    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(trace_list(run=run), request, view=self)
        return paginator.get_paginated_response(TraceSerializer(page, many=True, context={"request": request}).data)

    def post(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        serializer = TraceRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        trace = trace_request(user=request.user, run=run, steps=serializer.validated_data["steps"])
        body = TraceSerializer(trace, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class RunTraceDownloadView(APIView):
    """The zipped trace directory; open it in XProf (TensorBoard) or its trace.json.gz in Perfetto."""

    def get(self, request, run_id: int, trace_id: int):
        trace = trace_get(run=run_get_for_user(user=request.user, run_id=run_id), trace_id=trace_id)
        if not trace.file:
            raise NotFound(f"Trace {trace_id} of run {run_id} has no file (it is {trace.status}).")
        return FileResponse(trace.file.open("rb"), as_attachment=True,
                            filename=f"run-{run_id}-trace-{trace_id}.zip", content_type="application/zip")


class TrainerTraceUploadView(APIView):
    """Multipart ``first_step``, ``last_step`` and ``file`` (the zip), or ``error``, from the trainer."""

    permission_classes = [IsAdminUser]
    parser_classes = [MultiPartParser, FormParser]

    def post(self, request, run_id: int, trace_id: int):
        serializer = TraceUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        trace = trace_upload(run=run_get(run_id=run_id), trace_id=trace_id, first_step=data["first_step"],
                             last_step=data["last_step"], file=data.get("file"), error=data["error"])
        return Response(TraceSerializer(trace, context={"request": request}).data)


class TrainerTelemetryView(APIView):
    """``{"events": [TrainerStepEvent, ...]}`` from the trainer; 202 with a :class:`TelemetryReply`.

    The reply carries the run's pending trace requests: the trainer posts
    telemetry every fraction of a second while it trains, so a request
    reaches it within a step or two with no channel of its own.
    """

    permission_classes = [IsAdminUser]
    parser_classes = [NonFiniteJSONParser]

    def post(self, request, run_id: int):
        run = run_get(run_id=run_id)
        raw_events = request.data.get("events") if isinstance(request.data, dict) else None
        if not isinstance(raw_events, list):
            raise InvalidInput.for_field("events", "Expected a list of TrainerStepEvent objects.")
        if len(raw_events) > MAX_EVENTS_PER_POST:
            raise InvalidInput.for_field(
                "events", f"At most {MAX_EVENTS_PER_POST} events per post."
            )
        events = []
        for index, raw_event in enumerate(raw_events):
            try:
                events.append(TrainerStepEvent.model_validate(raw_event))
            except pydantic.ValidationError as error:
                raise InvalidInput.from_pydantic(error, prefix=f"events.{index}") from None
        stored = metric_events_record(run=run, events=events)
        reply = TelemetryReply(stored=stored, trace_requests=trace_requests_pending(run=run))
        return Response(reply.model_dump(mode="json"), status=status.HTTP_202_ACCEPTED)
