"""API of telemetry: the charts' backfill and range queries, and the trainer's posts."""

import pydantic
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from config.db_limits import require_db_int, require_no_nul
from config.query_params import int_query_param
from domain_errors import InvalidInput
from runs.selectors import run_get, run_get_for_user
from tandem.contracts import TrainerStepEvent

from .models import MetricPoint
from .selectors import metric_chart, metric_points_after
from .serializers import MetricChartQuerySerializer
from .services import metric_events_record

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


class NonFiniteJSONParser(JSONParser):
    """Accepts NaN and Infinity, which Python's json writes for a diverged loss."""

    strict = False


def _require_storable(event: TrainerStepEvent, *, prefix: str) -> None:
    require_db_int(event.step, f"{prefix}.step")
    require_db_int(event.policy_version, f"{prefix}.policy_version")
    max_length = MetricPoint._meta.get_field("name").max_length
    for name in event.metric_values():
        require_no_nul(name, f"{prefix}.rollout_metrics")
        if len(name) > max_length:
            raise InvalidInput.for_field(
                f"{prefix}.rollout_metrics",
                f"Metric name '{name[:80]}' is longer than {max_length} characters.",
            )


@extend_schema(tags=["trainer"])
class TrainerTelemetryView(APIView):
    """``{"events": [TrainerStepEvent, ...]}`` from the trainer; 202 ``{"stored": n}``."""

    permission_classes = [IsAdminUser]
    parser_classes = [NonFiniteJSONParser]

    @extend_schema(
        request=inline_serializer(
            "TrainerTelemetry",
            {
                "events": serializers.ListField(
                    child=serializers.DictField(), help_text="TrainerStepEvent objects."
                )
            },
        ),
        responses={
            202: inline_serializer("TelemetryStored", {"stored": serializers.IntegerField()})
        },
    )
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
            _require_storable(events[-1], prefix=f"events.{index}")
        stored = metric_events_record(run=run, events=events)
        return Response({"stored": stored}, status=status.HTTP_202_ACCEPTED)
