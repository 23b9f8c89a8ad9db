"""API of runs, for users and for the trainer."""

import pydantic
from rest_framework import status
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import project_resolve_for_user
from config.pagination import PageNumberPagination
from domain_errors import InvalidInput
from tandem.contracts import TrainerHeartbeat
from tandem.run_config import RunConfig

from .selectors import run_get, run_get_for_user, run_list
from .serializers import (
    ClaimedRunSerializer,
    RunCloneSerializer,
    RunCreateSerializer,
    RunSerializer,
    TrainerClaimSerializer,
)
from .services import (
    run_cancel,
    run_claim_next,
    run_clone,
    run_create,
    run_heartbeat,
    run_pause,
    run_resume,
)


class RunListCreateView(APIView):
    def get(self, request):
        runs = run_list(user=request.user, status=request.query_params.get("status") or None)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        serializer = RunSerializer(page, many=True, context={"request": request})
        return paginator.get_paginated_response(serializer.data)

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
        body = RunSerializer(run, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class RunDetailView(APIView):
    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(RunSerializer(run, context={"request": request}).data)


class RunCancelView(APIView):
    def post(self, request, run_id: int):
        run = run_cancel(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunSerializer(run, context={"request": request}).data)


class RunPauseView(APIView):
    def post(self, request, run_id: int):
        run = run_pause(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunSerializer(run, context={"request": request}).data)


class RunResumeView(APIView):
    def post(self, request, run_id: int):
        run = run_resume(user=request.user, run=run_get_for_user(user=request.user, run_id=run_id))
        return Response(RunSerializer(run, context={"request": request}).data)


class RunCloneView(APIView):
    def post(self, request, run_id: int):
        serializer = RunCloneSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_clone(
            user=request.user,
            run=run_get_for_user(user=request.user, run_id=run_id),
            config_changes=serializer.validated_data["config"],
            name=serializer.validated_data["name"],
        )
        body = RunSerializer(run, context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED)


class TrainerClaimView(APIView):
    permission_classes = [IsAdminUser]

    def post(self, request):
        serializer = TrainerClaimSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = run_claim_next(worker=serializer.validated_data["worker"])
        if run is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response({"run": ClaimedRunSerializer(run).data})


class TrainerHeartbeatView(APIView):
    permission_classes = [IsAdminUser]

    def post(self, request, run_id: int):
        try:
            heartbeat = TrainerHeartbeat.model_validate(request.data)
        except pydantic.ValidationError as error:
            raise InvalidInput.from_pydantic(error) from None
        run = run_heartbeat(run=run_get(run_id=run_id), heartbeat=heartbeat)
        return Response({"status": run.status})


class RunConfigSchemaView(APIView):
    """The JSON schema of RunConfig, so clients can build or check a config before posting it."""

    def get(self, request):
        return Response(RunConfig.model_json_schema())
