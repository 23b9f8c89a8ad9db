"""API of SFT datasets: registering versions, reading and deleting them, and the trainer's pages of rows.

A registration is answered 202: the file was checked (a bad one is a 400 naming
each line and field) and its version is ``pending``; the datasets worker stores
its rows, and ``GET .../versions/<n>/`` says ``status`` (ready, or failed with
``failure_reason``) and ``rows_stored``. The SDK and ``tandem datasets register``
poll it.
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsTrainer
from accounts.query_params import project_query_param
from accounts.selectors import project_resolve_for_user
from common.json_input import StrictJSONParser
from common.openapi import ErrorSerializer
from runs.selectors import run_get_held_by
from tandem.contracts import TRAINER_HEADER, DatasetRowsPage

from .models import Dataset
from .selectors import (
    dataset_get_for_user,
    dataset_list,
    dataset_rows,
    dataset_version_for_run,
    dataset_version_get,
    dataset_version_require_ready,
)
from .serializers import (
    DatasetDetailSerializer,
    DatasetRegisterSerializer,
    DatasetRowSerializer,
    DatasetSerializer,
    DatasetVersionSerializer,
    RowsQuerySerializer,
)
from .services import dataset_read_path, dataset_upload, dataset_version_delete
from .uploads import capped_upload_handlers


@extend_schema(tags=["datasets"])
class DatasetListCreateView(ListAPIView):
    """``GET``: the datasets of your projects. ``POST``: a new version of a dataset (1 for a new name)."""

    queryset = Dataset.objects.none()  # the model, for the schema
    serializer_class = DatasetSerializer
    parser_classes = [MultiPartParser, FormParser, StrictJSONParser]
    ordering_fields = {"name": "name", "created_at": "created_at", "id": "id"}
    ordering = ["project__name", "project_id", "name"]

    def initialize_request(self, request, *args, **kwargs):
        # Before anything reads the body: an upload past the cap is refused while it streams.
        if request.method == "POST":
            request.upload_handlers = capped_upload_handlers(request)
        return super().initialize_request(request, *args, **kwargs)

    def get_queryset(self):
        project = project_query_param(self.request)  # another's project is a 404
        return dataset_list(user=self.request.user, project=project)

    @extend_schema(
        request={"multipart/form-data": DatasetRegisterSerializer, "application/json": DatasetRegisterSerializer},
        responses={
            202: OpenApiResponse(DatasetDetailSerializer, description=(
                "Checked and accepted: the new version (``latest_version``) is ``pending`` until the datasets "
                "worker has stored its rows; poll ``GET /api/datasets/{id}/versions/{number}/`` for "
                "``status`` ``ready`` (or ``failed``, with ``failure_reason``).")),
            400: OpenApiResponse(ErrorSerializer, description=(
                "A row is invalid (each error names its line and field; checking stops at the 20th bad line), "
                "or the project's quota (TANDEM_DATASET_PROJECT_MAX_BYTES, TANDEM_DATASET_PROJECT_MAX_VERSIONS) "
                "would be passed.")),
            409: OpenApiResponse(ErrorSerializer, description="Another upload of yours is still checked or stored."),
            413: OpenApiResponse(ErrorSerializer, description="The file is larger than TANDEM_DATASET_MAX_BYTES."),
        },
    )
    def post(self, request):
        serializer = DatasetRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = project_resolve_for_user(user=request.user, project_id=data.get("project"))
        if "file" in data:
            version = dataset_upload(user=request.user, project=project, name=data["name"],
                                     file=data["file"], file_name=data["file"].name)
        else:
            version = dataset_read_path(user=request.user, project=project, name=data["name"], path=data["path"])
        dataset = dataset_get_for_user(user=request.user, dataset_id=version.dataset_id)
        return Response(DatasetDetailSerializer(dataset).data, status=status.HTTP_202_ACCEPTED)


@extend_schema(tags=["datasets"])
class DatasetDetailView(GenericAPIView):
    serializer_class = DatasetDetailSerializer

    def get(self, request, dataset_id: int):
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        return Response(DatasetDetailSerializer(dataset).data)


@extend_schema(tags=["datasets"])
class DatasetVersionDetailView(GenericAPIView):
    """``GET``: the version, with ``status`` and ``rows_stored``. ``DELETE``: the version and its rows."""

    serializer_class = DatasetVersionSerializer

    def get(self, request, dataset_id: int, number: int):
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        return Response(DatasetVersionSerializer(dataset_version_get(dataset=dataset, number=number)).data)

    @extend_schema(responses={
        204: None,
        409: OpenApiResponse(ErrorSerializer, description="A run that has not ended uses the version."),
    })
    def delete(self, request, dataset_id: int, number: int):
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        dataset_version_delete(user=request.user, version=dataset_version_get(dataset=dataset, number=number))
        return Response(status=status.HTTP_204_NO_CONTENT)


RowsPageSerializer = inline_serializer("DatasetRowsPage", {
    "offset": serializers.IntegerField(),
    "total": serializers.IntegerField(help_text="Rows of the version."),
    "rows": DatasetRowSerializer(many=True),
})
TrainerRowsPageSerializer = inline_serializer("TrainerDatasetRowsPage", {
    "schema_version": serializers.IntegerField(),
    "dataset": serializers.CharField(),
    "version": serializers.IntegerField(),
    "offset": serializers.IntegerField(),
    "total": serializers.IntegerField(),
    "rows": serializers.ListField(child=serializers.DictField(), help_text="{messages, metadata} each."),
})


def _rows_page(version, request) -> dict:
    query = RowsQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    offset, limit = query.validated_data["offset"], query.validated_data["limit"]
    rows = dataset_rows(version=version).filter(index__gte=offset)[:limit]
    return {"offset": offset, "total": version.row_count, "rows": DatasetRowSerializer(rows, many=True).data}


@extend_schema(tags=["datasets"])
class DatasetVersionRowsView(APIView):
    """``?offset=&limit=``: the version's rows in file order."""

    reads_query_parameters = True

    @extend_schema(parameters=[RowsQuerySerializer], responses={
        200: RowsPageSerializer,
        409: OpenApiResponse(ErrorSerializer, description="The version's rows are not all stored yet, or failed."),
    })
    def get(self, request, dataset_id: int, number: int):
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        version = dataset_version_get(dataset=dataset, number=number)
        dataset_version_require_ready(version=version)
        return Response(_rows_page(version, request))


@extend_schema(tags=["trainer"])
class TrainerDatasetRowsView(APIView):
    """``?offset=&limit=``: rows of a dataset version the run's config pins, for its trainer (DatasetRowsPage)."""

    permission_classes = [IsTrainer]
    reads_query_parameters = True

    @extend_schema(parameters=[RowsQuerySerializer], responses={200: TrainerRowsPageSerializer})
    def get(self, request, run_id: int, name: str, number: int):
        run = run_get_held_by(run_id=run_id, trainer=request.headers.get(TRAINER_HEADER, ""))
        version = dataset_version_for_run(run_project=run.project, run_config=run.config, name=name,
                                          number=number)
        page = _rows_page(version, request)
        rows = [{"messages": row["messages"], "metadata": row["metadata"]} for row in page["rows"]]
        body = DatasetRowsPage(dataset=name, version=number, offset=page["offset"], total=page["total"], rows=rows)
        return Response(body.model_dump(mode="json"))
