"""API of telemetry: the charts' backfill and range queries, traces on demand, and the trainer's posts."""

from django.conf import settings
from django.http import FileResponse, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsTrainer
from common.db_limits import require_db_int, require_no_nul
from common.domain_errors import NotFound, records_of
from common.json_input import StrictJSONParser
from common.openapi import ErrorSerializer
from common.query_params import int_query_param
from common.stored_text import json_text_unescape
from runs.selectors import run_get_for_user, run_get_held_by, run_list
from runs.sublist_views import RunSubListView
from tandem.contracts import TRAINER_HEADER, StepEpisodes, TelemetryReply, TrainerStepEvent

from .device_listings import active_run_devices, tandem_processes
from .metric_exports import CSVOrJSONDownload, metric_table_json, metric_tables_csv
from .models import Trace
from .selectors import (
    device_snapshot_get,
    idle_summary,
    metric_chart,
    metric_names,
    metric_names_matching,
    metric_points_after,
    metric_table,
    step_timeline_recent,
    trace_get,
    trace_list,
    trace_requests_pending,
)
from .serializers import (
    ActiveRunDevicesSerializer,
    IdleSummarySerializer,
    MetricChartQuerySerializer,
    MetricCompareExportQuerySerializer,
    MetricExportQuerySerializer,
    ProcessListSerializer,
    RunIdleSerializer,
    TimelineQuerySerializer,
    TimelineSerializer,
    TraceRequestSerializer,
    TraceSerializer,
    TraceUploadSerializer,
)
from .services import metric_events_record, metric_series_refusals, trace_request, trace_upload

DEFAULT_POINTS_PER_PAGE = 1000
MAX_POINTS_PER_PAGE = 5000
MAX_EVENTS_PER_POST = 1000


class MetricPointSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    name = serializers.CharField()
    value = serializers.FloatField()


class MetricPageSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    points = MetricPointSerializer(many=True, help_text="Whole steps only, by step then name.")
    next_after_step = serializers.IntegerField(
        allow_null=True, help_text="Ask again with ?after_step= this; null when points is empty."
    )


@extend_schema(tags=["runs"])
class RunMetricsView(APIView):
    """``?after_step=<n>&names=a,b&limit=<n>``: the points after a step cursor, by step."""

    reads_query_parameters = True

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after_step", int, description="Cursor: points after this step.", default=-1
            ),
            OpenApiParameter(
                "names", str, description="Comma-separated metric names; all if absent."
            ),
            OpenApiParameter(
                "limit",
                int,
                description=f"About how many points (1 to {MAX_POINTS_PER_PAGE}).",
                default=DEFAULT_POINTS_PER_PAGE,
            ),
        ],
        responses={200: MetricPageSerializer},
    )
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        after_step = int_query_param(request, "after_step", default=-1)
        limit = int_query_param(request, "limit", default=DEFAULT_POINTS_PER_PAGE)
        limit = min(max(limit, 1), MAX_POINTS_PER_PAGE)
        names = [name for name in request.query_params.get("names", "").split(",") if name]
        page = metric_points_after(run=run, after_step=after_step, names=names, limit=limit)
        points = [{"step": step, "name": name, "value": value} for step, name, value in page.points]
        return Response({"run": run.pk, "points": points, "next_after_step": page.next_after_step})


@extend_schema(tags=["runs"])
class RunMetricChartView(APIView):
    """``?names=a,b&points=1000&from_step=&to_step=``: series in min/max/mean buckets (README)."""

    reads_query_parameters = True

    @extend_schema(
        parameters=[MetricChartQuerySerializer],
        responses={200: inline_serializer("MetricChart", {
            "run": serializers.IntegerField(),
            "from_step": serializers.IntegerField(allow_null=True),
            "to_step": serializers.IntegerField(allow_null=True),
            "resolution": serializers.IntegerField(help_text="Steps per bucket; 1: raw points."),
            "series": serializers.DictField(
                child=serializers.DictField(),
                help_text="Per name: its points or buckets (steps, min, max, mean, count); see the README.",
            ),
        })},
    )
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        query = MetricChartQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        chart = metric_chart(run=run, **query.validated_data)
        return Response(
            {
                "run": run.pk,
                "from_step": chart.from_step,
                "to_step": chart.to_step,
                "resolution": chart.resolution,
                "series": {name: vars(series) for name, series in chart.series.items()},
            }
        )


@extend_schema(tags=["runs"])
class RunMetricNamesView(APIView):
    """Every series the run has logged, by name: what the metric explorer finds panels among."""

    @extend_schema(summary="The run's series names", responses={200: inline_serializer("MetricNames", {
        "run": serializers.IntegerField(),
        "names": serializers.ListField(child=serializers.CharField()),
    })})
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response({"run": run.pk, "names": metric_names(run=run)})


def _metric_download(tables: list, *, file_format: str, filename: str, body) -> HttpResponse | Response:
    if file_format == "json":
        response = Response(body)
    else:
        response = HttpResponse(metric_tables_csv(tables), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}.{file_format}"'
    return response


_EXPORT_RESPONSES = {
    (200, "application/json"): OpenApiTypes.OBJECT,
    (200, "text/csv"): OpenApiTypes.STR,
}


@extend_schema(tags=["runs"])
class RunMetricExportView(CSVOrJSONDownload, APIView):
    """``?names=a,rollout/*/latency_p90_s&format=csv|json``: the series, every point, with each x-axis.

    CSV: ``run, run_name, step, rl_step, wall_time_s, samples_trained`` and a column per series, a row
    per step; JSON: the same as parallel columns. See the README.
    """

    reads_query_parameters = True

    @extend_schema(summary="Download series as CSV or JSON", parameters=[MetricExportQuerySerializer],
                   responses=_EXPORT_RESPONSES)
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        query = MetricExportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        table = metric_table(run=run, names=metric_names_matching(run=run, patterns=query.validated_data["names"]))
        return _metric_download([(run, table)], file_format=query.validated_data["format"],
                                filename=f"run-{run.pk}-metrics", body=metric_table_json(run, table))


@extend_schema(tags=["runs"])
class MetricCompareExportView(CSVOrJSONDownload, APIView):
    """``?runs=1,2,3&names=...&format=csv|json``: the same series of several of your runs in one file.

    CSV: the runs' rows one after another (the ``run`` column tells them apart); JSON: ``{"runs": [...]}``,
    each as the one-run download. A run that is not yours is a 404.
    """

    reads_query_parameters = True

    @extend_schema(summary="Download several runs' series as CSV or JSON",
                   parameters=[MetricCompareExportQuerySerializer], responses={
                       **_EXPORT_RESPONSES,
                       404: OpenApiResponse(ErrorSerializer, description="A run of ``runs`` that is not yours."),
                   })
    def get(self, request):
        query = MetricCompareExportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run_ids = query.validated_data["runs"]
        runs = {run.pk: run for run in run_list(user=request.user).filter(pk__in=run_ids)}
        missing = [run_id for run_id in run_ids if run_id not in runs]
        if missing:
            raise NotFound(f"Run {missing[0]} not found.")
        tables = []
        for run_id in run_ids:
            run = runs[run_id]
            names = metric_names_matching(run=run, patterns=query.validated_data["names"])
            tables.append((run, metric_table(run=run, names=names)))
        return _metric_download(tables, file_format=query.validated_data["format"], filename="compared-metrics",
                                body={"runs": [metric_table_json(run, table) for run, table in tables]})


@extend_schema(tags=["runs"])
class RunTimelineView(APIView):
    """``?last=60&after_step=``: the newest steps' stages and every episode they consumed (the Gantt's data)."""

    reads_query_parameters = True

    @extend_schema(parameters=[TimelineQuerySerializer], responses={200: TimelineSerializer})
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        query = TimelineQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        window = step_timeline_recent(run=run, **query.validated_data)
        steps = window.steps
        # Rows are built here, not by the serializers (the schema's): a window holds
        # thousands of episodes, already stored in the shape they are answered in.
        return Response({
            "run": run.pk,
            "status": run.status,
            "steps_kept": settings.TANDEM_TIMELINE_STEPS_KEPT,
            "newest_step": window.newest_step,
            "truncated": window.truncated,
            "started_at": min(step.started_at for step in steps) if steps else None,
            "ended_at": max(step.ended_at for step in steps) if steps else None,
            "steps": [
                {"step": step.step, "phase": step.phase, "policy_version": step.policy_version,
                 "started_at": step.started_at, "ended_at": step.ended_at, "stages": step.stages,
                 "episodes": json_text_unescape(step.episodes)}
                for step in steps
            ],
            "idle": _idle(run),
        })


def _idle(run) -> dict | None:
    summary = idle_summary(run=run)
    return None if summary is None else IdleSummarySerializer(summary).data


class RunIdleView(APIView):
    """What the trainer waited on over the run's newest 50 steps: its idle share by environment and cause."""

    @extend_schema(summary="What the trainer waited on", responses={200: RunIdleSerializer})
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response({"run": run.pk, "idle": _idle(run)})


class NonFiniteJSONParser(StrictJSONParser):
    """Accepts NaN and Infinity, which Python's json writes for a diverged loss; and NUL, which
    ``_require_storable`` refuses field by field."""

    allow_non_finite = True
    allow_nul = True


def _require_storable(event: TrainerStepEvent, *, prefix: str) -> None:
    require_db_int(event.step, f"{prefix}.step")
    require_db_int(event.policy_version, f"{prefix}.policy_version")
    # A series name the platform cannot store is refused alone (telemetry.services.metric_series_refusals).
    for index, episode in enumerate(event.episodes):
        # An environment's name and error text are stored with a lossless escape (services); ids are ours.
        for field in ("trajectory_id", "group_id"):
            require_no_nul(getattr(episode, field), f"{prefix}.episodes.{index}.{field}")


@extend_schema(tags=["trainer"])
@extend_schema(tags=["runs"])
class RunDevicesView(APIView):
    """The newest device report of the run's trainer: kind, count, memory, duty cycle, MFU, host."""

    @extend_schema(responses={200: inline_serializer("RunDevices", {
        "run": serializers.IntegerField(),
        "step": serializers.IntegerField(),
        "recorded_at": serializers.DateTimeField(),
        "report": serializers.DictField(help_text="tandem.contracts.DeviceReport"),
    })})
    def get(self, request, run_id: int):
        snapshot = device_snapshot_get(run=run_get_for_user(user=request.user, run_id=run_id))
        return Response({"run": run_id, "step": snapshot.step, "recorded_at": snapshot.recorded_at,
                         "report": snapshot.report})


@extend_schema(tags=["runs"])
class ActiveRunDevicesView(APIView):
    """Every run of your projects that a trainer holds now, with a row per device of its newest report.

    Not paginated: only runs a trainer holds are listed, one per trainer at most.
    """

    @extend_schema(responses={200: ActiveRunDevicesSerializer(many=True)})
    def get(self, request):
        return Response(active_run_devices(user=request.user))


@extend_schema(tags=["runs"])
class ProcessListView(APIView):
    """Every live Tandem process: web servers, the platform worker, rollout workers (idle ones too), trainers.

    Each with its CPU (cores used since its previous report), resident memory and
    its host's CPU and memory, reported every few seconds. Any signed-in user
    sees every process (they are shared infrastructure), but only the runs of
    their own projects among those a process works on. Not paginated: one row
    per process.
    """

    @extend_schema(responses={200: ProcessListSerializer})
    def get(self, request):
        return Response(tandem_processes(user=request.user))


@extend_schema(tags=["runs"])
class RunTraceListCreateView(RunSubListView):
    """``GET``: the run's traces, newest first. ``POST {"steps": n}``: trace the trainer's next n steps."""

    queryset = Trace.objects.none()  # the model, for the schema
    serializer_class = TraceSerializer
    run_records = staticmethod(trace_list)

    @extend_schema(request=TraceRequestSerializer, responses={
        201: TraceSerializer,
        409: OpenApiResponse(ErrorSerializer, description="The run finished or was cancelled."),
    })
    def post(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        serializer = TraceRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        trace = trace_request(user=request.user, run=run, steps=serializer.validated_data["steps"])
        body = TraceSerializer(trace, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


@extend_schema(tags=["runs"])
class RunTraceDownloadView(APIView):
    """The zipped trace directory; open it in XProf (TensorBoard) or its trace.json.gz in Perfetto."""

    @extend_schema(responses={(200, "application/zip"): OpenApiTypes.BINARY})
    def get(self, request, run_id: int, trace_id: int):
        trace = trace_get(run=run_get_for_user(user=request.user, run_id=run_id), trace_id=trace_id)
        if not trace.file:
            raise NotFound(f"Trace {trace_id} of run {run_id} has no file (it is {trace.status}).")
        return FileResponse(trace.file.open("rb"), as_attachment=True,
                            filename=f"run-{run_id}-trace-{trace_id}.zip", content_type="application/zip")


@extend_schema(tags=["trainer"])
class TrainerTraceUploadView(GenericAPIView):
    """Multipart ``first_step``, ``last_step`` and ``file`` (the zip), or ``error``, from the trainer."""

    permission_classes = [IsTrainer]
    parser_classes = [MultiPartParser, FormParser]
    serializer_class = TraceUploadSerializer

    @extend_schema(request={"multipart/form-data": TraceUploadSerializer}, responses={
        200: TraceSerializer,
        409: OpenApiResponse(ErrorSerializer, description="The trace was already handed in."),
    })
    def post(self, request, run_id: int, trace_id: int):
        serializer = TraceUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        trace = trace_upload(run=run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, "")), trace_id=trace_id, first_step=data["first_step"],
                             last_step=data["last_step"], file=data.get("file"), error=data["error"])
        return Response(TraceSerializer(trace, context={"request": request}).data)


class TrainerTelemetryView(APIView):
    """``{"events": [TrainerStepEvent, ...]}`` from the trainer; 202 with a :class:`TelemetryReply`.

    The reply carries the run's pending trace requests: the trainer posts
    telemetry every fraction of a second while it trains, so a request
    reaches it within a step or two with no channel of its own.
    """

    permission_classes = [IsTrainer]
    parser_classes = [NonFiniteJSONParser]

    @extend_schema(
        request=inline_serializer(
            "TrainerTelemetry",
            {
                "events": serializers.ListField(
                    child=serializers.DictField(), help_text="TrainerStepEvent objects."
                ),
                "episode_chunks": serializers.ListField(
                    child=serializers.DictField(), required=False,
                    help_text="StepEpisodes objects: the rest of the episodes of events whose episodes_total is set.",
                ),
            },
        ),
        responses={
            202: inline_serializer("TelemetryStored", {
                "schema_version": serializers.IntegerField(),
                "stored": serializers.IntegerField(),
                "trace_requests": serializers.ListField(
                    child=serializers.DictField(), help_text="TraceRequest objects: {id, steps}."),
                "refused_series": serializers.ListField(
                    child=serializers.DictField(), help_text="RefusedSeries objects: {step, name, reason}, the "
                    "series left out of a post stored otherwise."),
            })
        },
    )
    def post(self, request, run_id: int):
        run = run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, ""))
        body = request.data if isinstance(request.data, dict) else {}
        events = records_of(body.get("events"), field="events", record=TrainerStepEvent, noun="events",
                            at_most=MAX_EVENTS_PER_POST,
                            check=lambda event, prefix: _require_storable(event, prefix=prefix))
        chunks = records_of(body.get("episode_chunks", []), field="episode_chunks", record=StepEpisodes,
                            noun="chunks", at_most=MAX_EVENTS_PER_POST)
        stored = metric_events_record(run=run, events=events, episode_chunks=chunks)
        reply = TelemetryReply(stored=stored, trace_requests=trace_requests_pending(run=run),
                               refused_series=metric_series_refusals(events))
        return Response(reply.model_dump(mode="json"), status=status.HTTP_202_ACCEPTED)
