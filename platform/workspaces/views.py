"""API of the workspace: a project's runs as a view selects them, their series on one grid, saved views and
reports. Every route is the project's members' only: another's project, view or report is a 404."""

from django.http import QueryDict
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response

from accounts.selectors import project_get_for_user
from common.openapi import ErrorSerializer

from .models import Report, SavedView
from .report_body import report_views
from .selectors import (
    MAX_WORKSPACE_RUNS,
    report_get_for_user,
    report_list,
    saved_view_get,
    saved_view_list,
    workspace_runs,
    workspace_series,
)
from .serializers import (
    ReportSerializer,
    ReportUpdateSerializer,
    ReportWriteSerializer,
    SavedViewSerializer,
    SavedViewUpdateSerializer,
    SavedViewWriteSerializer,
    SeriesQuerySerializer,
)
from .services import (
    report_create,
    report_delete,
    report_update,
    saved_view_delete,
    saved_view_save,
    saved_view_update,
)
from .view_state import WorkspaceView

CONFLICT = {409: OpenApiResponse(ErrorSerializer, description="The project has a view of that name.")}


def view_of_request(query: QueryDict) -> WorkspaceView:
    """The workspace view a request's query string names (the page's URL, as it is)."""
    return WorkspaceView.parse(query.urlencode())


@extend_schema(tags=["workspace"])
class WorkspaceRunsView(GenericAPIView):
    """The project's runs that a workspace view selects, with its table's columns."""

    reads_query_parameters = True

    @extend_schema(
        summary="A workspace's runs",
        description=(
            "The query is the workspace's own (`q`, `status`, `g`, `c`, `o`, `f.<column>` ...; see "
            f"`platform/README.md`, Workspace). The newest {MAX_WORKSPACE_RUNS} runs that `q` and `status` select "
            "are read; `matched`, `read` and `filtered_out` say how many were left out and why."),
        parameters=[OpenApiParameter("q", str), OpenApiParameter("status", str), OpenApiParameter("g", str),
                    OpenApiParameter("c", str), OpenApiParameter("o", str)],
        responses={200: inline_serializer("WorkspaceRuns", {
            "runs": serializers.ListField(child=serializers.DictField()),
            "matched": serializers.IntegerField(), "read": serializers.IntegerField(),
            "filtered_out": serializers.IntegerField(),
            "config_keys": serializers.ListField(child=serializers.CharField()),
            "metric_names": serializers.ListField(child=serializers.CharField()),
            "query": serializers.CharField(help_text="The view's canonical query."),
        })},
    )
    def get(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        view = view_of_request(request.query_params)
        found = workspace_runs(project=project, view=view)
        return Response({"runs": found.rows, "matched": found.matched, "read": found.read,
                         "filtered_out": found.filtered_out, "config_keys": found.config_keys,
                         "metric_names": found.metric_names, "query": view.query()})


@extend_schema(tags=["workspace"])
class WorkspaceSeriesView(GenericAPIView):
    """Several runs' series, bucketed on one step grid so that they overlay (min, max and mean per bucket)."""

    reads_query_parameters = True

    @extend_schema(
        summary="Series of many runs", parameters=[SeriesQuerySerializer],
        description=("The series `names` of the project's runs `runs`, bucketed on one step grid for every run "
                     "(min, max, mean and count per bucket), between `points` and twice as many buckets per series; "
                     "`from_step` and `to_step` narrow the range (a zoom), finer."),
        responses={200: inline_serializer("WorkspaceSeries", {
            "resolution": serializers.IntegerField(help_text="Steps per bucket; 1: raw points."),
            "from_step": serializers.IntegerField(allow_null=True),
            "to_step": serializers.IntegerField(allow_null=True),
            "series": serializers.DictField(help_text="{run id: {name: {x, mean, min, max, count}}}; x: a bucket's middle step."),
        })},
    )
    def get(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        query = SeriesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        chart = workspace_series(project=project, run_ids=data["runs"], names=data["names"], points=data["points"],
                                 from_step=data["from_step"], to_step=data["to_step"])
        return Response({"resolution": chart.resolution, "from_step": chart.from_step, "to_step": chart.to_step,
                         "series": {str(run_id): by_name for run_id, by_name in chart.series.items()}})


@extend_schema(tags=["workspace"])
@extend_schema_view(get=extend_schema(summary="List saved views", description=(
    "The project's saved views, by name: any member reads them.")))
class SavedViewListCreateView(ListAPIView):
    """The project's saved views, by name; writers save one."""

    queryset = SavedView.objects.none()
    serializer_class = SavedViewSerializer

    def get_queryset(self):
        return saved_view_list(project=project_get_for_user(user=self.request.user,
                                                            project_id=self.kwargs["project_id"]))

    @extend_schema(summary="Save a view", request=SavedViewWriteSerializer,
                   description=("Project writers only. The workspace query under a name, stored canonical; a name "
                                "taken is a 409 unless `replace`, which overwrites that view."),
                   responses={201: SavedViewSerializer, 200: SavedViewSerializer, **CONFLICT})
    def post(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        body = SavedViewWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        view = saved_view_save(user=request.user, project=project, **body.validated_data)
        return Response(SavedViewSerializer(view).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["workspace"])
class SavedViewDetailView(GenericAPIView):
    serializer_class = SavedViewSerializer

    def _view(self, request, project_id: int, view_id: int) -> SavedView:
        return saved_view_get(project=project_get_for_user(user=request.user, project_id=project_id),
                              view_id=view_id)

    @extend_schema(summary="Get a saved view", description="Its name, canonical query, and the workspace URL showing it.")
    def get(self, request, project_id: int, view_id: int):
        return Response(SavedViewSerializer(self._view(request, project_id, view_id)).data)

    @extend_schema(summary="Rename a saved view or change its query", request=SavedViewUpdateSerializer,
                   description="Project writers only; a new query is checked and stored canonical.",
                   responses={200: SavedViewSerializer, **CONFLICT})
    def patch(self, request, project_id: int, view_id: int):
        view = self._view(request, project_id, view_id)
        body = SavedViewUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(SavedViewSerializer(saved_view_update(user=request.user, view=view,
                                                              **body.validated_data)).data)

    @extend_schema(summary="Delete a saved view", responses={204: None},
                   description="Project writers only. A report line that embedded it then says it is missing.")
    def delete(self, request, project_id: int, view_id: int):
        saved_view_delete(user=request.user, view=self._view(request, project_id, view_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=["workspace"])
@extend_schema_view(get=extend_schema(summary="List reports", description=(
    "The project's reports, newest change first: any member reads them, nobody else.")))
class ReportListCreateView(ListAPIView):
    """The project's reports, newest change first; writers write one."""

    queryset = Report.objects.none()
    serializer_class = ReportSerializer

    def get_queryset(self):
        project = project_get_for_user(user=self.request.user, project_id=self.kwargs["project_id"])
        return report_list(user=self.request.user, project=project)

    @extend_schema(summary="Write a report", request=ReportWriteSerializer, responses={201: ReportSerializer},
                   description=("Project writers only. Markdown (raw HTML is escaped); a line '{{view: <name>}}' "
                                "embeds that saved view's live panels. Read by the project's members only."))
    def post(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        body = ReportWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        report = report_create(user=request.user, project=project, **body.validated_data)
        return Response(ReportSerializer(report).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["workspace"])
class ReportDetailView(GenericAPIView):
    serializer_class = ReportSerializer

    def _report(self, request, project_id: int, report_id: int) -> Report:
        return report_get_for_user(user=request.user, project_id=project_id, report_id=report_id)

    @extend_schema(summary="Get a report", description=(
        "The report, and the saved views it embeds, resolved in its own project."), responses={200: inline_serializer("ReportDetail", {
        "report": ReportSerializer(),
        "views": serializers.ListField(child=serializers.DictField(), help_text=(
            "The views it embeds, in order: name, and id and query (null when the project has no view of that name)."))
    })})
    def get(self, request, project_id: int, report_id: int):
        report = self._report(request, project_id, report_id)
        embeds = [{"name": block.view_name, "id": block.view_id,
                   "query": block.view_query if block.view_id is not None else None}
                  for block in report_views(project=report.project, body=report.body)]
        return Response({"report": ReportSerializer(report).data, "views": embeds})

    @extend_schema(summary="Change a report", request=ReportUpdateSerializer, responses={200: ReportSerializer},
                   description="Project writers only: its title, its body, or both.")
    def patch(self, request, project_id: int, report_id: int):
        report = self._report(request, project_id, report_id)
        body = ReportUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(ReportSerializer(report_update(user=request.user, report=report,
                                                       **body.validated_data)).data)

    @extend_schema(summary="Delete a report", responses={204: None}, description="Project writers only.")
    def delete(self, request, project_id: int, report_id: int):
        report_delete(user=request.user, report=self._report(request, project_id, report_id))
        return Response(status=status.HTTP_204_NO_CONTENT)

