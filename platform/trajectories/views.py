"""API of trajectory samples: the browser's list and detail, and the trainer's posts."""

import pydantic
from rest_framework import status
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from config.pagination import PageNumberPagination
from domain_errors import InvalidInput
from runs.selectors import run_get, run_get_for_user
from tandem.contracts import TrajectorySample as TrajectorySampleRecord

from .selectors import TrajectoryFilters, trajectory_sample_get, trajectory_sample_list
from .serializers import (
    TrajectoryFiltersSerializer,
    TrajectorySampleSerializer,
    TrajectorySampleSummarySerializer,
)
from .services import trajectory_samples_record

MAX_SAMPLES_PER_POST = 200


class RunTrajectoryListView(APIView):
    """``?status=ok|failed&environment=&min_reward=&max_reward=``: the run's samples, newest step first."""

    def get(self, request, run_id: int):
        run = run_get_for_user(user=request.user, run_id=run_id)
        filters = TrajectoryFiltersSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        samples = trajectory_sample_list(run=run, filters=TrajectoryFilters(**filters.validated_data))
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(samples, request, view=self)
        serializer = TrajectorySampleSummarySerializer(page, many=True)
        return paginator.get_paginated_response(serializer.data)


class RunTrajectoryDetailView(APIView):
    def get(self, request, run_id: int, trajectory_id: str):
        run = run_get_for_user(user=request.user, run_id=run_id)
        sample = trajectory_sample_get(run=run, trajectory_id=trajectory_id)
        return Response(TrajectorySampleSerializer(sample).data)


class TrainerTrajectoriesView(APIView):
    """``{"samples": [TrajectorySample, ...]}`` from the trainer; 202 ``{"stored": n}``."""

    permission_classes = [IsAdminUser]

    def post(self, request, run_id: int):
        run = run_get(run_id=run_id)
        raw_samples = request.data.get("samples") if isinstance(request.data, dict) else None
        if not isinstance(raw_samples, list):
            raise InvalidInput.for_field("samples", "Expected a list of TrajectorySample objects.")
        if len(raw_samples) > MAX_SAMPLES_PER_POST:
            raise InvalidInput.for_field("samples", f"At most {MAX_SAMPLES_PER_POST} samples per post.")
        samples = []
        for index, raw_sample in enumerate(raw_samples):
            try:
                samples.append(TrajectorySampleRecord.model_validate(raw_sample))
            except pydantic.ValidationError as error:
                raise InvalidInput.from_pydantic(error, prefix=f"samples.{index}") from None
        stored = trajectory_samples_record(run=run, samples=samples)
        return Response({"stored": stored}, status=status.HTTP_202_ACCEPTED)
