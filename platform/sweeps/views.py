"""API of sweeps: create one, list and read them, cancel one."""

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response

from accounts.selectors import project_resolve_for_user

from .models import Sweep
from .selectors import sweep_details, sweep_get_for_user, sweep_list
from .serializers import SweepSerializer, SweepWriteSerializer
from .services import sweep_cancel, sweep_create


def _answer(sweeps: list[Sweep], *, many: bool):
    context = {"details": sweep_details(sweeps=sweeps, importances=not many)}
    return SweepSerializer(sweeps if many else sweeps[0], many=many, context=context).data


@extend_schema(tags=["sweeps"])
@extend_schema_view(get=extend_schema(summary="List sweeps", description=(
    "The sweeps of the caller's projects, newest first, with their trials (importances: read one sweep).")))
class SweepListCreateView(ListAPIView):
    queryset = Sweep.objects.none()  # the model, for the schema
    serializer_class = SweepSerializer

    def get_queryset(self):
        return sweep_list(user=self.request.user)

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(_answer(list(page), many=True))

    @extend_schema(summary="Create a sweep", description=(
        "Project writers only. Runs of `base_config` over `search_space`, sampled by Optuna (grid, random or "
        "TPE), judged by `metric` towards `goal`, at most `max_runs`, `concurrency` at a time (under the "
        "project's active-run quota); with a pruner (median, successive halving), a trial whose metric falls "
        "behind is cancelled with the pruner's reason. Each trial's config is checked as Start checks a run."),
        request=SweepWriteSerializer, responses={201: SweepSerializer})
    def post(self, request):
        serializer = SweepWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        project = project_resolve_for_user(user=request.user, project_id=data.pop("project", None))
        sweep = sweep_create(user=request.user, project=project, **data)
        return Response(_answer([sweep], many=False), status=status.HTTP_201_CREATED)


@extend_schema(tags=["sweeps"])
class SweepDetailView(GenericAPIView):
    serializer_class = SweepSerializer

    @extend_schema(summary="Get a sweep", description="Its trials, best trial and parameter importances.")
    def get(self, request, sweep_id: int):
        return Response(_answer([sweep_get_for_user(user=request.user, sweep_id=sweep_id)], many=False))


@extend_schema(tags=["sweeps"])
class SweepCancelView(GenericAPIView):
    serializer_class = SweepSerializer

    @extend_schema(summary="Cancel a sweep", request=None,
                   description="Project writers only. Its running trials' runs are cancelled; it starts no more.")
    def post(self, request, sweep_id: int):
        sweep = sweep_cancel(user=request.user, sweep=sweep_get_for_user(user=request.user, sweep_id=sweep_id))
        return Response(_answer([sweep], many=False))
