"""API of runs, for users and for the trainer."""

import pydantic
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsTrainer
from accounts.query_params import project_query_param
from accounts.selectors import project_resolve_for_user
from common.db_limits import DB_INT_MAX, require_db_int, require_no_nul
from common.domain_errors import InvalidInput
from common.openapi import ErrorSerializer
from tandem.configs.run import RunConfig
from tandem.contracts import TrainerHeartbeat, TrainerHeartbeatReply

from .filters import RunFilter
from .models import Run
from .selectors import run_get, run_get_for_user, run_list
from .serializers import (
    ClaimedRunSerializer,
    RunAnnotationSerializer,
    RunCloneSerializer,
    RunCreateSerializer,
    RunDetailSerializer,
    RunSerializer,
    TrainerClaimSerializer,
)
from .services import (
    run_annotate,
    run_cancel,
    run_claim_next,
    run_clone,
    run_create,
    run_heartbeat,
    run_pause,
    run_resume,
)

CONFLICT = {409: OpenApiResponse(ErrorSerializer, description="The run has already ended.")}
TRANSITION_CONFLICT = {
    409: OpenApiResponse(ErrorSerializer, description="The run's status does not allow this change.")
}


@extend_schema(tags=["runs"])
class RunListCreateView(ListAPIView):
    """The runs of the caller's projects, newest first unless ``?ordering=`` says otherwise."""

    queryset = Run.objects.none()  # the model, for the schema; get_queryset is the real one
    serializer_class = RunSerializer
    filterset_class = RunFilter
    ordering_fields = {
        "created_at": "created_at",
        "started_at": "started_at",
        "finished_at": "finished_at",
        "name": "name",
        "status": "status",
        "trainer_step": "trainer_step",
        "id": "id",
    }
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        project_query_param(self.request)  # another's project is a 404, not an empty list
        # Each run's attempts in one more query for the page, not one per run.
        return run_list(user=self.request.user).prefetch_related("attempt_history")

    @extend_schema(request=RunCreateSerializer, responses={201: RunDetailSerializer})
    def post(self, request):
        serializer = RunCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = project_resolve_for_user(user=request.user, project_id=data.get("project"))
        run = run_create(
            user=request.user,
            project=project,
            environment_name=data["environment"],
            config=data["config"],
            name=data["name"],
        )
        body = RunDetailSerializer(run, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


@extend_schema(tags=["runs"])
class RunDetailView(GenericAPIView):
    serializer_class = RunDetailSerializer

    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(RunDetailSerializer(run, context={"request": request}).data)

    @extend_schema(request=RunAnnotationSerializer, responses={200: RunDetailSerializer},
                   summary="Edit a run's tags and notes (a writer of its project)")
    def patch(self, request, run_id: int):
        serializer = RunAnnotationSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_annotate(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id),
                           tags=serializer.validated_data.get("tags"), notes=serializer.validated_data.get("notes"))
        return Response(RunDetailSerializer(run, context={"request": request}).data)


@extend_schema(tags=["runs"])
class RunCancelView(GenericAPIView):
    serializer_class = RunDetailSerializer

    @extend_schema(request=None, responses={200: RunDetailSerializer, **CONFLICT})
    def post(self, request, run_id: int):
        run = run_cancel(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunDetailSerializer(run, context={"request": request}).data)


@extend_schema(tags=["runs"])
class RunPauseView(GenericAPIView):
    serializer_class = RunDetailSerializer

    @extend_schema(request=None, responses={200: RunDetailSerializer, **TRANSITION_CONFLICT})
    def post(self, request, run_id: int):
        run = run_pause(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunDetailSerializer(run, context={"request": request}).data)


@extend_schema(tags=["runs"])
class RunResumeView(GenericAPIView):
    serializer_class = RunDetailSerializer

    @extend_schema(request=None, responses={200: RunDetailSerializer, **TRANSITION_CONFLICT})
    def post(self, request, run_id: int):
        run = run_resume(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunDetailSerializer(run, context={"request": request}).data)


@extend_schema(tags=["runs"])
class RunCloneView(GenericAPIView):
    serializer_class = RunCloneSerializer

    @extend_schema(request=RunCloneSerializer, responses={201: RunDetailSerializer})
    def post(self, request, run_id: int):
        serializer = RunCloneSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_clone(
            user=request.user,
            run=run_get_for_user(user=request.user, run_id=run_id),
            config_changes=serializer.validated_data["config"],
            name=serializer.validated_data["name"],
        )
        body = RunDetailSerializer(run, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


@extend_schema(tags=["trainer"])
class TrainerClaimView(APIView):
    permission_classes = [IsTrainer]

    @extend_schema(
        request=TrainerClaimSerializer,
        responses={
            200: inline_serializer("ClaimedRunEnvelope", {"run": ClaimedRunSerializer()}),
            204: OpenApiResponse(description="No run is queued."),
        },
    )
    def post(self, request):
        serializer = TrainerClaimSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_claim_next(worker=serializer.validated_data["worker"])
        if run is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response({"run": ClaimedRunSerializer(run).data})


def _heartbeat_schema() -> dict:
    """TrainerHeartbeat's JSON schema, with the bounds of the columns it lands in."""
    schema = TrainerHeartbeat.model_json_schema()
    for name in ("policy_version", "trainer_step"):
        schema["properties"][name]["maximum"] = DB_INT_MAX
    # OpenAPI 3.0 has no "null" type: pydantic's anyOf [..., null] becomes nullable.
    for name in ("status", "retry_after_s"):
        field = schema["properties"][name]
        choices = [option for option in field.pop("anyOf") if option.get("type") != "null"]
        field.update(choices[0], nullable=True)
    return schema


def _heartbeat_reply_schema() -> dict:
    """TrainerHeartbeatReply's JSON schema, its status enum inlined (OpenAPI resolves no $defs)."""
    schema = TrainerHeartbeatReply.model_json_schema()
    run_status = schema.pop("$defs")["RunStatus"]
    status = schema["properties"]["status"]
    del status["$ref"]
    status.update(type=run_status["type"], enum=run_status["enum"])
    return schema


@extend_schema(tags=["trainer"])
class TrainerHeartbeatView(APIView):
    permission_classes = [IsTrainer]

    @extend_schema(
        request={"application/json": _heartbeat_schema()},
        responses={
            200: _heartbeat_reply_schema(),
            409: OpenApiResponse(
                ErrorSerializer,
                description="The run is queued (code `run_not_claimed`), or another trainer holds it: it "
                "was resumed elsewhere (code `run_held_by_another_trainer`).",
            ),
        },
    )
    def post(self, request, run_id: int):
        try:
            heartbeat = TrainerHeartbeat.model_validate(request.data)
        except pydantic.ValidationError as error:
            raise InvalidInput.from_pydantic(error) from None
        require_db_int(heartbeat.policy_version, "policy_version")
        require_db_int(heartbeat.trainer_step, "trainer_step")
        require_no_nul(heartbeat.message, "message")
        run = run_heartbeat(run=run_get(run_id=run_id), heartbeat=heartbeat)
        return Response(TrainerHeartbeatReply(status=run.status).model_dump(mode="json"))


@extend_schema(tags=["runs"])
class RunConfigSchemaView(APIView):
    """The JSON schema of RunConfig, so clients can build or check a config before posting it."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response(RunConfig.model_json_schema())
