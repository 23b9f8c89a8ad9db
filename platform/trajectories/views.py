"""API of trajectory samples: the browser's list and detail, and the trainer's posts."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from accounts.permissions import IsTrainer
from common.domain_errors import records_of
from common.json_input import ModelOutputJSONParser
from runs.selectors import run_get_for_user, run_get_held_by
from runs.sublist_views import RunSubListView
from tandem.contracts import TRAINER_HEADER
from tandem.contracts import TrajectorySample as TrajectorySampleRecord

from .selectors import (
    TrajectoryFilters,
    trajectory_group_get,
    trajectory_sample_get,
    trajectory_sample_list,
)
from .serializers import (
    TrajectoryFiltersSerializer,
    TrajectoryGroupSerializer,
    TrajectorySampleSerializer,
    TrajectorySampleSummarySerializer,
)
from .services import trajectory_samples_record

MAX_SAMPLES_PER_POST = 200


@extend_schema(tags=["trajectories"], parameters=[TrajectoryFiltersSerializer])
class RunTrajectoryListView(RunSubListView):
    """``?status=ok|failed&environment=&min_reward=&max_reward=&q=``: the run's samples, newest step first;
    ``q``: text in any of their turns."""

    serializer_class = TrajectorySampleSummarySerializer

    def run_records(self, *, run):
        # The query is validated by TrajectoryFiltersSerializer, not by filter backends.
        filters = TrajectoryFiltersSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return trajectory_sample_list(run=run, filters=TrajectoryFilters(**filters.validated_data))


@extend_schema(tags=["trajectories"])
class RunTrajectoryDetailView(GenericAPIView):
    serializer_class = TrajectorySampleSerializer

    def get(self, request, run_id: int, trajectory_id: str):
        run = run_get_for_user(user=request.user, run_id=run_id)
        sample = trajectory_sample_get(run=run, trajectory_id=trajectory_id)
        return Response(TrajectorySampleSerializer(sample).data)


@extend_schema(tags=["trajectories"], responses=TrajectoryGroupSerializer)
class RunTrajectoryGroupView(GenericAPIView):
    """The sampled episodes of one GRPO group, with their rewards and advantages, highest advantage first."""

    serializer_class = TrajectoryGroupSerializer

    def get(self, request, run_id: int, group_id: str):
        run = run_get_for_user(user=request.user, run_id=run_id)
        episodes = trajectory_group_get(run=run, group_id=group_id)
        group_size = next((sample.group_size for sample in episodes if sample.group_size), None)
        return Response(TrajectoryGroupSerializer({
            "run": run.pk, "group_id": group_id, "group_size": group_size,
            "steps": sorted({sample.step for sample in episodes}), "episodes": episodes,
        }).data)


@extend_schema(tags=["trainer"])
class TrainerTrajectoriesView(GenericAPIView):
    """``{"samples": [TrajectorySample, ...]}`` from the trainer; 202 ``{"stored": n}``."""

    permission_classes = [IsTrainer]
    # A model's text may hold NUL and lone surrogates: stored escaped (common/stored_text.py), not refused.
    parser_classes = [ModelOutputJSONParser]

    @extend_schema(
        request=inline_serializer("TrajectorySamplesPost", {
            "samples": serializers.ListField(child=serializers.DictField(),
                                             help_text="TrajectorySample records (tandem.contracts).")}),
        responses={202: inline_serializer("TrajectorySamplesStored", {"stored": serializers.IntegerField()})},
    )
    def post(self, request, run_id: int):
        run = run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, ""))
        raw_samples = request.data.get("samples") if isinstance(request.data, dict) else None
        samples = records_of(raw_samples, field="samples", record=TrajectorySampleRecord, noun="samples",
                             at_most=MAX_SAMPLES_PER_POST)
        stored = trajectory_samples_record(run=run, samples=samples)
        return Response({"stored": stored}, status=status.HTTP_202_ACCEPTED)
