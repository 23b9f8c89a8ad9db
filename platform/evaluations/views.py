"""API of evaluations: the run's list for people, and the trainer's reports."""

import math

import pydantic
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsTrainer
from common.db_limits import DB_INT_MAX, require_db_int, require_no_nul
from common.domain_errors import InvalidInput
from common.openapi import ErrorSerializer
from runs.selectors import run_get_for_user, run_get_held_by
from runs.serializers import RunSerializer
from runs.sublist_views import RunSubListView
from tandem.contracts import TRAINER_HEADER, EvaluationReport
from telemetry.models import MetricPoint

from .models import Evaluation
from .selectors import evaluation_list, evaluation_progress_list
from .serializers import (
    EvaluationProgressListSerializer,
    EvaluationRunCreateSerializer,
    EvaluationSerializer,
)
from .services import evaluation_record, evaluation_run_create, evaluation_series_name

_INTEGER_FIELDS = ("evaluation", "step", "policy_version", "tasks", "samples_per_task", "episodes")


def _report_schema() -> dict:
    """EvaluationReport's JSON schema, in what OpenAPI 3.0 can say and with the columns' bounds."""
    schema = EvaluationReport.model_json_schema()
    for name in _INTEGER_FIELDS:
        schema["properties"][name]["maximum"] = DB_INT_MAX
    # OpenAPI 3.0 has no prefixItems: an interval is an array of two numbers.
    interval = schema["properties"]["intervals"]["additionalProperties"]
    interval.pop("prefixItems")
    interval["items"] = {"type": "number"}
    return schema


def _require_storable(report: EvaluationReport) -> None:
    """What the contract allows and the columns or JSON cannot hold, refused naming the field."""
    for name in _INTEGER_FIELDS:
        require_db_int(getattr(report, name), name, minimum=0)
    if len(report.environment) > Evaluation._meta.get_field("environment").max_length:
        raise InvalidInput.for_field("environment", "Longer than 200 characters.")
    for name in ("environment", "reason", "metrics", "intervals", "trajectory_ids"):
        require_no_nul(getattr(report, name), name)
    # JSON has no NaN or infinity, and a number too large for a double (1e400) reads as infinity.
    if not math.isfinite(report.temperature):
        raise InvalidInput.for_field("temperature", "Must be a finite number.")
    for name, value in report.metrics.items():
        # A label as long as the registry allows is cut to fit (metric_series_name); a metric name
        # that leaves no room for one cannot name a series.
        try:
            series = evaluation_series_name(kind=report.kind, label=report.environment, metric=name, own=False)
        except ValueError:
            series = ""
        if not series or len(series) > MetricPoint._meta.get_field("name").max_length:
            raise InvalidInput.for_field(f"metrics.{name[:80]}", "Metric name too long to name a series of "
                                         f"{MetricPoint._meta.get_field('name').max_length} characters.")
        if not math.isfinite(value):
            raise InvalidInput.for_field(f"metrics.{name}", "Must be a finite number.")
    for name, bounds in report.intervals.items():
        if not all(math.isfinite(bound) for bound in bounds):
            raise InvalidInput.for_field(f"intervals.{name[:80]}", "Bounds must be finite numbers.")


@extend_schema(tags=["runs"])
class RunEvaluationListView(RunSubListView):
    """The run's held-out evaluations, first one first."""

    queryset = Evaluation.objects.none()  # the model, for the schema
    serializer_class = EvaluationSerializer
    run_records = staticmethod(evaluation_list)


@extend_schema(tags=["runs"])
class RunEvaluationProgressView(APIView):
    """How far each of the run's evaluations has come: episodes received of those expected, as its trainer
    keeps them in Redis (for progress bars; the record of an evaluation is its report in the list).

    Not paginated: a run has one row per evaluation point.
    """

    @extend_schema(responses={200: EvaluationProgressListSerializer})
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        progress = evaluation_progress_list(run=run)
        evaluations = None if progress is None else [item.model_dump(exclude={"schema_version"}) for item in progress]
        return Response(EvaluationProgressListSerializer({"run": run.pk, "evaluations": evaluations}).data)


@extend_schema(tags=["runs"])
class RunEvaluateView(GenericAPIView):
    """An evaluation-only run of one of the run's kept checkpoints: no training, one evaluation."""

    serializer_class = EvaluationRunCreateSerializer

    @extend_schema(request=EvaluationRunCreateSerializer, responses={
        201: RunSerializer,
        400: OpenApiResponse(ErrorSerializer, description="No such kept checkpoint (field `step`), or an "
                             "invalid evaluation section (its field named)."),
    })
    def post(self, request, run_id: int):
        serializer = EvaluationRunCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        run = evaluation_run_create(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id),
                                    step=data["step"], evaluation=data["evaluation"], name=data["name"])
        return Response(RunSerializer(run, context={"request": request}).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["trainer"])
class TrainerEvaluationsView(APIView):
    """An ``EvaluationReport`` from the trainer: 201 when new, 200 when it updated the same evaluation."""

    permission_classes = [IsTrainer]

    @extend_schema(
        request={"application/json": _report_schema()},
        responses={
            200: OpenApiResponse(EvaluationSerializer, description="A retried post: the evaluation, updated."),
            201: OpenApiResponse(EvaluationSerializer, description="The evaluation, stored."),
            409: OpenApiResponse(
                ErrorSerializer,
                description="The run is held by no trainer (code `run_not_claimed`), or by another one "
                "(code `run_held_by_another_trainer`).",
            ),
        },
    )
    def post(self, request, run_id: int):
        run = run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, ""))
        try:
            report = EvaluationReport.model_validate(request.data)
        except pydantic.ValidationError as error:
            raise InvalidInput.from_pydantic(error) from None
        _require_storable(report)
        evaluation, created = evaluation_record(run=run, report=report)
        return Response(EvaluationSerializer(evaluation).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
