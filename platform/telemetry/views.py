"""API of telemetry: the charts' backfill and range queries, and the trainer's posts."""

import pydantic
from rest_framework import status
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from config.query_params import int_query_param
from domain_errors import InvalidInput
from runs.selectors import run_get, run_get_for_user
from tandem.contracts import TrainerStepEvent

from .selectors import metric_chart, metric_points_after
from .serializers import MetricChartQuerySerializer
from .services import metric_events_record

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


class RunMetricChartView(APIView):
    """``?names=a,b&points=1000&from_step=&to_step=``: series in min/max/mean buckets (README)."""

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


class TrainerTelemetryView(APIView):
    """``{"events": [TrainerStepEvent, ...]}`` from the trainer; 202 ``{"stored": n}``."""

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
        return Response({"stored": stored}, status=status.HTTP_202_ACCEPTED)
