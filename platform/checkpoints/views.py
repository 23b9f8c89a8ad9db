"""API of checkpoints: list, export to safetensors, download, delete; and the trainer's reports."""

import tempfile
import zipfile
from pathlib import Path

import pydantic
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsTrainer
from common.db_limits import DB_INT_MAX, require_db_int, require_no_nul
from common.domain_errors import InvalidInput, NotFound
from common.openapi import ErrorSerializer
from runs.selectors import run_get_for_user, run_get_held_by
from runs.sublist_views import RunSubListView
from tandem.contracts import TRAINER_HEADER, CheckpointReport

from .models import Checkpoint
from .selectors import checkpoint_get, checkpoint_list, checkpoint_path_in_root
from .serializers import CheckpointSerializer
from .services import checkpoint_delete, checkpoint_export_start, checkpoints_report

FORBIDDEN = OpenApiResponse(ErrorSerializer, description="Viewers cannot change checkpoints.")


def _checkpoint(request, run_id: int, step: int) -> Checkpoint:
    run = run_get_for_user(user=request.user, run_id=run_id)
    if step > DB_INT_MAX:  # no checkpoint has such a step
        raise NotFound(f"Run {run_id} has no checkpoint of step {step}.")
    return checkpoint_get(run=run, step=step)


@extend_schema(tags=["runs"])
class RunCheckpointListView(RunSubListView):
    """The run's checkpoints, newest first, deleted ones included (with why)."""

    queryset = Checkpoint.objects.none()  # the model, for the schema
    serializer_class = CheckpointSerializer
    run_records = staticmethod(checkpoint_list)


@extend_schema(tags=["runs"])
class RunCheckpointDetailView(APIView):
    """``GET``: one checkpoint (poll its export_status). ``DELETE``: remove its files."""

    @extend_schema(responses={200: CheckpointSerializer})
    def get(self, request, run_id: int, step: int):
        checkpoint = _checkpoint(request, run_id, step)
        return Response(CheckpointSerializer(checkpoint, context={"request": request}).data)

    @extend_schema(responses={
        200: CheckpointSerializer,
        403: FORBIDDEN,
        409: OpenApiResponse(ErrorSerializer, description="Already deleted, or the newest checkpoint of a run "
                             "that may resume (starting, running, paused)."),
    })
    def delete(self, request, run_id: int, step: int):
        checkpoint = checkpoint_delete(user=request.user, checkpoint=_checkpoint(request, run_id, step))
        return Response(CheckpointSerializer(checkpoint, context={"request": request}).data)


@extend_schema(tags=["runs"])
class RunCheckpointExportView(APIView):
    """Export the checkpoint to Hugging Face safetensors on the platform worker; poll the checkpoint."""

    @extend_schema(request=None, responses={
        202: CheckpointSerializer,
        403: FORBIDDEN,
        409: OpenApiResponse(ErrorSerializer, description="Deleted, or an export is already running."),
    })
    def post(self, request, run_id: int, step: int):
        checkpoint = checkpoint_export_start(user=request.user, checkpoint=_checkpoint(request, run_id, step))
        return Response(CheckpointSerializer(checkpoint, context={"request": request}).data,
                        status=status.HTTP_202_ACCEPTED)


@extend_schema(tags=["runs"])
class RunCheckpointDownloadView(APIView):
    """The exported Hugging Face checkpoint (config.json and safetensors) as one zip; 404 until exported."""

    @extend_schema(responses={(200, "application/zip"): OpenApiTypes.BINARY})
    def get(self, request, run_id: int, step: int):
        checkpoint = _checkpoint(request, run_id, step)
        directory = Path(checkpoint.export_path)
        if (checkpoint.status != Checkpoint.Status.AVAILABLE
                or checkpoint.export_status != Checkpoint.ExportStatus.EXPORTED or not directory.is_dir()):
            raise NotFound(f"Checkpoint of step {step} of run {run_id} has no export "
                           f"(it is {checkpoint.status}, export {checkpoint.export_status}).")
        # Stored, not deflated: safetensors barely compress and may be gigabytes.
        archive = tempfile.TemporaryFile()  # noqa: SIM115 -- FileResponse closes it
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zipped:
            for path in sorted(directory.iterdir()):
                if path.is_file():
                    zipped.write(path, arcname=path.name)
        archive.seek(0)
        return FileResponse(archive, as_attachment=True, filename=f"run-{run_id}-step-{step}-safetensors.zip",
                            content_type="application/zip")


@extend_schema(tags=["trainer"])
class TrainerCheckpointsView(APIView):
    """``CheckpointReport`` from the trainer: every committed checkpoint now on disk."""

    permission_classes = [IsTrainer]

    @extend_schema(
        request=inline_serializer("TrainerCheckpointReport", {
            "checkpoints": serializers.ListField(child=serializers.DictField(),
                                                 help_text="CheckpointInfo objects: step, policy_version, path, size_bytes."),
        }),
        responses={200: CheckpointSerializer(many=True)},
    )
    def post(self, request, run_id: int):
        run = run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, ""))
        try:
            report = CheckpointReport.model_validate(request.data)
        except pydantic.ValidationError as exc:
            raise InvalidInput.from_pydantic(exc) from exc
        for index, info in enumerate(report.checkpoints):
            require_db_int(info.step, f"checkpoints.{index}.step")
            require_db_int(info.policy_version, f"checkpoints.{index}.policy_version")
            require_no_nul(info.path, f"checkpoints.{index}.path")
            if len(info.path) > Checkpoint._meta.get_field("path").max_length:
                raise InvalidInput.for_field(f"checkpoints.{index}.path", "Longer than 1000 characters.")
            if info.size_bytes > 2**63 - 1:
                raise InvalidInput.for_field(f"checkpoints.{index}.size_bytes", "Too large to store.")
            if Path(info.path).name != str(info.step) or not Path(info.path).is_absolute():
                raise InvalidInput.for_field(f"checkpoints.{index}.path",
                                             "Must be the absolute step directory, ending in the step.")
            if not checkpoint_path_in_root(run_id=run.pk, path=info.path):
                raise InvalidInput.for_field(f"checkpoints.{index}.path", (
                    f"Must lie in this run's directory under the checkpoint root "
                    f"(TANDEM_CHECKPOINT_ROOT/run-{run.pk}/<step>)."))
        checkpoints = checkpoints_report(run=run, report=report)
        return Response(CheckpointSerializer(checkpoints, many=True, context={"request": request}).data)

