"""Every HTTP route of the platform: pages, then the API (users', then the trainer's)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts import pages as account_pages
from accounts.views import (
    ApiTokenDetailView,
    ApiTokenListCreateView,
    MembershipDetailView,
    MembershipListCreateView,
    MetricExplorerLayoutView,
    ProjectDetailView,
    ProjectListCreateView,
)
from alerts import pages as alert_pages
from alerts.views import (
    AlertRuleDeliveryListView,
    AlertRuleDetailView,
    AlertRuleListCreateView,
    NotificationListView,
    NotificationReadView,
    NotificationsReadAllView,
    NotificationUnreadCountView,
)
from checkpoints.views import (
    RunCheckpointDetailView,
    RunCheckpointDownloadView,
    RunCheckpointExportView,
    RunCheckpointListView,
    TrainerCheckpointsView,
)
from common.api_root import ApiRootView
from dataset_registry import pages as dataset_pages
from dataset_registry.views import (
    DatasetDetailView,
    DatasetListCreateView,
    DatasetVersionDetailView,
    DatasetVersionRowsView,
    TrainerDatasetRowsView,
)
from environment_registry import pages as environment_pages
from environment_registry.views import (
    EnvironmentDetailView,
    EnvironmentListCreateView,
    EnvironmentVersionCreateView,
    EnvironmentVersionDetailView,
    EnvironmentVersionProbeView,
)
from evaluations import pages as evaluation_pages
from evaluations.views import (
    RunEvaluateView,
    RunEvaluationListView,
    RunEvaluationProgressView,
    TrainerEvaluationsView,
)
from run_logs.views import RunLogDownloadView, RunLogListView, RunLogLoggerListView
from runs import pages as run_pages
from runs.views import (
    RunCancelView,
    RunCloneView,
    RunConfigSchemaView,
    RunDetailView,
    RunListCreateView,
    RunPauseView,
    RunResumeView,
    TrainerClaimView,
    TrainerHeartbeatView,
)
from sweeps import pages as sweep_pages
from sweeps.views import SweepCancelView, SweepDetailView, SweepListCreateView
from telemetry import pages as telemetry_pages
from telemetry.views import (
    ActiveRunDevicesView,
    MetricCompareExportView,
    ProcessListView,
    RunDevicesView,
    RunIdleView,
    RunMetricChartView,
    RunMetricExportView,
    RunMetricNamesView,
    RunMetricsView,
    RunTimelineView,
    RunTraceDownloadView,
    RunTraceListCreateView,
    TrainerTelemetryView,
    TrainerTraceUploadView,
)
from trajectories import pages as trajectory_pages
from trajectories.views import (
    RunTrajectoryDetailView,
    RunTrajectoryGroupView,
    RunTrajectoryListView,
    TrainerTrajectoriesView,
)
from workspaces import pages as workspace_pages
from workspaces.views import (
    ReportDetailView,
    ReportListCreateView,
    SavedViewDetailView,
    SavedViewListCreateView,
    WorkspaceRunsView,
    WorkspaceSeriesView,
)

pages = [
    path("", RedirectView.as_view(pattern_name="run-list-page", permanent=False)),
    path("login/", account_pages.ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", run_pages.run_list_page, name="run-list-page"),
    path("runs/rows/", run_pages.run_list_rows_page, name="run-list-rows-page"),
    path("runs/new/", run_pages.run_new_page, name="run-new-page"),
    path("runs/new/validate/", run_pages.run_new_validate_page, name="run-new-validate-page"),
    path("runs/<int:run_id>/", run_pages.run_page, name="run-page"),
    path("runs/<int:run_id>/cancel/", run_pages.run_cancel_page, name="run-cancel-page"),
    path("runs/<int:run_id>/pause/", run_pages.run_pause_page, name="run-pause-page"),
    path("runs/<int:run_id>/resume/", run_pages.run_resume_page, name="run-resume-page"),
    path("runs/<int:run_id>/clone/", run_pages.run_clone_page, name="run-clone-page"),
    path("runs/<int:run_id>/facts/", run_pages.run_facts_page, name="run-facts-page"),
    path("runs/compare/", run_pages.run_compare_page, name="run-compare-page"),
    path("runs/<int:run_id>/timeline/", telemetry_pages.run_timeline_page, name="run-timeline-page"),
    path(
        "runs/<int:run_id>/trajectories/",
        trajectory_pages.trajectory_list_page,
        name="trajectory-list-page",
    ),
    path(
        "runs/<int:run_id>/trajectories/<str:trajectory_id>/",
        trajectory_pages.trajectory_page,
        name="trajectory-page",
    ),
    path(
        "runs/<int:run_id>/trajectory-groups/<str:group_id>/",
        trajectory_pages.trajectory_group_page,
        name="trajectory-group-page",
    ),
    path("devices/", telemetry_pages.devices_page, name="devices-page"),
    path("environments/", environment_pages.environment_list_page, name="environment-list-page"),
    path(
        "environments/<int:environment_id>/",
        environment_pages.environment_page,
        name="environment-page",
    ),
    path(
        "environments/<int:environment_id>/versions/<int:number>/probe/",
        environment_pages.environment_version_probe_page,
        name="environment-version-probe-page",
    ),
    path("evaluations/", evaluation_pages.evaluation_list_page, name="evaluation-list-page"),
    path("evaluations.csv", evaluation_pages.evaluation_csv, name="evaluation-csv"),
    path("datasets/", dataset_pages.dataset_list_page, name="dataset-list-page"),
    path("datasets/<int:dataset_id>/", dataset_pages.dataset_page, name="dataset-page"),
    path("datasets/<int:dataset_id>/versions/<int:number>/delete/", dataset_pages.dataset_version_delete_page,
         name="dataset-version-delete"),
    path("tokens/", account_pages.token_list_page, name="token-list-page"),
    path("workspace/", workspace_pages.workspace_home_page, name="workspace-home-page"),
    path("projects/<int:project_id>/workspace/", workspace_pages.workspace_page, name="workspace-page"),
    path("projects/<int:project_id>/reports/", workspace_pages.report_list_page, name="report-list-page"),
    path("projects/<int:project_id>/reports/<int:report_id>/", workspace_pages.report_page, name="report-page"),
    path("projects/<int:project_id>/reports/<int:report_id>/edit/", workspace_pages.report_edit_page,
         name="report-edit-page"),
    path("projects/<int:project_id>/reports/<int:report_id>/delete/", workspace_pages.report_delete_page,
         name="report-delete-page"),
    path("sweeps/", sweep_pages.sweep_list_page, name="sweep-list-page"),
    path("sweeps/<int:sweep_id>/", sweep_pages.sweep_page, name="sweep-page"),
    path("sweeps/<int:sweep_id>/cancel/", sweep_pages.sweep_cancel_page, name="sweep-cancel-page"),
    path("alerts/", alert_pages.alert_rule_list_page, name="alert-rule-list-page"),
    path("alerts/<int:rule_id>/delete/", alert_pages.alert_rule_delete_page, name="alert-rule-delete-page"),
    path("alerts/<int:rule_id>/edit/", alert_pages.alert_rule_edit_page, name="alert-rule-edit-page"),
    path("alerts/<int:rule_id>/enabled/", alert_pages.alert_rule_enabled_page, name="alert-rule-enabled-page"),
    path("notifications/", alert_pages.notification_list_page, name="notification-list-page"),
    path("notifications/read-all/", alert_pages.notifications_read_all_page, name="notifications-read-all-page"),
    path(
        "notifications/<int:notification_id>/read/",
        alert_pages.notification_read_page,
        name="notification-read-page",
    ),
    path(
        "tokens/<int:token_id>/revoke/",
        account_pages.token_revoke_page,
        name="token-revoke-page",
    ),
    path("admin/", admin.site.urls),
]

api = [
    path("api/", ApiRootView.as_view(), name="api-root"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/tokens/", ApiTokenListCreateView.as_view(), name="api-tokens"),
    path("api/tokens/<int:token_id>/", ApiTokenDetailView.as_view(), name="api-token-detail"),
    path("api/projects/", ProjectListCreateView.as_view(), name="api-projects"),
    path("api/projects/<int:project_id>/", ProjectDetailView.as_view(), name="api-project-detail"),
    path(
        "api/projects/<int:project_id>/members/",
        MembershipListCreateView.as_view(),
        name="api-project-members",
    ),
    path(
        "api/projects/<int:project_id>/members/<str:username>/",
        MembershipDetailView.as_view(),
        name="api-project-member",
    ),
    path("api/environments/", EnvironmentListCreateView.as_view(), name="api-environments"),
    path(
        "api/environments/<int:environment_id>/",
        EnvironmentDetailView.as_view(),
        name="api-environment-detail",
    ),
    path(
        "api/environments/<int:environment_id>/versions/",
        EnvironmentVersionCreateView.as_view(),
        name="api-environment-versions",
    ),
    path(
        "api/environments/<int:environment_id>/versions/<int:number>/",
        EnvironmentVersionDetailView.as_view(),
        name="api-environment-version-detail",
    ),
    path(
        "api/environments/<int:environment_id>/versions/<int:number>/probe/",
        EnvironmentVersionProbeView.as_view(),
        name="api-environment-version-probe",
    ),
    path("api/projects/<int:project_id>/workspace/runs/", WorkspaceRunsView.as_view(),
         name="api-workspace-runs"),
    path("api/projects/<int:project_id>/workspace/series/", WorkspaceSeriesView.as_view(),
         name="api-workspace-series"),
    path("api/projects/<int:project_id>/views/", SavedViewListCreateView.as_view(), name="api-saved-views"),
    path("api/projects/<int:project_id>/views/<int:view_id>/", SavedViewDetailView.as_view(),
         name="api-saved-view-detail"),
    path("api/projects/<int:project_id>/reports/", ReportListCreateView.as_view(), name="api-reports"),
    path("api/projects/<int:project_id>/reports/<int:report_id>/", ReportDetailView.as_view(),
         name="api-report-detail"),
    path("api/datasets/", DatasetListCreateView.as_view(), name="api-datasets"),
    path("api/datasets/<int:dataset_id>/", DatasetDetailView.as_view(), name="api-dataset-detail"),
    path(
        "api/datasets/<int:dataset_id>/versions/<int:number>/",
        DatasetVersionDetailView.as_view(),
        name="api-dataset-version-detail",
    ),
    path(
        "api/datasets/<int:dataset_id>/versions/<int:number>/rows/",
        DatasetVersionRowsView.as_view(),
        name="api-dataset-version-rows",
    ),
    path("api/runs/", RunListCreateView.as_view(), name="api-runs"),
    path("api/runs/<int:run_id>/", RunDetailView.as_view(), name="api-run-detail"),
    path("api/runs/<int:run_id>/cancel/", RunCancelView.as_view(), name="api-run-cancel"),
    path("api/runs/<int:run_id>/pause/", RunPauseView.as_view(), name="api-run-pause"),
    path("api/runs/<int:run_id>/resume/", RunResumeView.as_view(), name="api-run-resume"),
    path("api/runs/<int:run_id>/clone/", RunCloneView.as_view(), name="api-run-clone"),
    path("api/runs/<int:run_id>/metrics/", RunMetricsView.as_view(), name="api-run-metrics"),
    path("api/runs/<int:run_id>/metrics/names/", RunMetricNamesView.as_view(), name="api-run-metric-names"),
    path("api/runs/<int:run_id>/metrics/export/", RunMetricExportView.as_view(), name="api-run-metric-export"),
    path("api/metrics/export/", MetricCompareExportView.as_view(), name="api-metric-compare-export"),
    path("api/metric-explorer/layout/", MetricExplorerLayoutView.as_view(), name="api-metric-explorer-layout"),
    path(
        "api/runs/<int:run_id>/trajectories/",
        RunTrajectoryListView.as_view(),
        name="api-run-trajectories",
    ),
    path(
        "api/runs/<int:run_id>/trajectories/<str:trajectory_id>/",
        RunTrajectoryDetailView.as_view(),
        name="api-run-trajectory-detail",
    ),
    path(
        "api/runs/<int:run_id>/trajectory-groups/<str:group_id>/",
        RunTrajectoryGroupView.as_view(),
        name="api-run-trajectory-group",
    ),
    path(
        "api/runs/<int:run_id>/metrics/series/",
        RunMetricChartView.as_view(),
        name="api-run-metric-series",
    ),
    path(
        "api/runs/<int:run_id>/evaluations/",
        RunEvaluationListView.as_view(),
        name="api-run-evaluations",
    ),
    path(
        "api/runs/<int:run_id>/evaluations/progress/",
        RunEvaluationProgressView.as_view(),
        name="api-run-evaluation-progress",
    ),
    path("api/runs/<int:run_id>/evaluate/", RunEvaluateView.as_view(), name="api-run-evaluate"),
    path("api/runs/<int:run_id>/logs/", RunLogListView.as_view(), name="api-run-logs"),
    path("api/runs/<int:run_id>/logs.txt", RunLogDownloadView.as_view(), name="api-run-logs-download"),
    path("api/runs/<int:run_id>/logs/loggers/", RunLogLoggerListView.as_view(), name="api-run-log-loggers"),
    path("api/runs/<int:run_id>/devices/", RunDevicesView.as_view(), name="api-run-devices"),
    path("api/runs/<int:run_id>/timeline/", RunTimelineView.as_view(), name="api-run-timeline"),
    path("api/runs/<int:run_id>/idle/", RunIdleView.as_view(), name="api-run-idle"),
    path("api/runs/<int:run_id>/traces/", RunTraceListCreateView.as_view(), name="api-run-traces"),
    path(
        "api/runs/<int:run_id>/traces/<int:trace_id>/download/",
        RunTraceDownloadView.as_view(),
        name="api-run-trace-download",
    ),
    path(
        "api/runs/<int:run_id>/checkpoints/",
        RunCheckpointListView.as_view(),
        name="api-run-checkpoints",
    ),
    path(
        "api/runs/<int:run_id>/checkpoints/<int:step>/",
        RunCheckpointDetailView.as_view(),
        name="api-run-checkpoint-detail",
    ),
    path(
        "api/runs/<int:run_id>/checkpoints/<int:step>/export/",
        RunCheckpointExportView.as_view(),
        name="api-run-checkpoint-export",
    ),
    path(
        "api/runs/<int:run_id>/checkpoints/<int:step>/download/",
        RunCheckpointDownloadView.as_view(),
        name="api-run-checkpoint-download",
    ),
    path("api/devices/", ActiveRunDevicesView.as_view(), name="api-devices"),
    path("api/processes/", ProcessListView.as_view(), name="api-processes"),
    path("api/run-config/schema/", RunConfigSchemaView.as_view(), name="api-run-config-schema"),
    path("api/sweeps/", SweepListCreateView.as_view(), name="api-sweeps"),
    path("api/sweeps/<int:sweep_id>/", SweepDetailView.as_view(), name="api-sweep-detail"),
    path("api/sweeps/<int:sweep_id>/cancel/", SweepCancelView.as_view(), name="api-sweep-cancel"),
    path("api/alert-rules/", AlertRuleListCreateView.as_view(), name="api-alert-rules"),
    path("api/alert-rules/<int:rule_id>/", AlertRuleDetailView.as_view(), name="api-alert-rule-detail"),
    path(
        "api/alert-rules/<int:rule_id>/deliveries/",
        AlertRuleDeliveryListView.as_view(),
        name="api-alert-rule-deliveries",
    ),
    path("api/notifications/", NotificationListView.as_view(), name="api-notifications"),
    path(
        "api/notifications/unread-count/",
        NotificationUnreadCountView.as_view(),
        name="api-notifications-unread-count",
    ),
    path("api/notifications/read-all/", NotificationsReadAllView.as_view(), name="api-notifications-read-all"),
    path(
        "api/notifications/<int:notification_id>/read/",
        NotificationReadView.as_view(),
        name="api-notification-read",
    ),
]

trainer_api = [
    path("api/trainer/claim/", TrainerClaimView.as_view(), name="api-trainer-claim"),
    path(
        "api/trainer/runs/<int:run_id>/heartbeat/",
        TrainerHeartbeatView.as_view(),
        name="api-trainer-heartbeat",
    ),
    path(
        "api/trainer/runs/<int:run_id>/telemetry/",
        TrainerTelemetryView.as_view(),
        name="api-trainer-telemetry",
    ),
    path(
        "api/trainer/runs/<int:run_id>/trajectories/",
        TrainerTrajectoriesView.as_view(),
        name="api-trainer-trajectories",
    ),
    path(
        "api/trainer/runs/<int:run_id>/checkpoints/",
        TrainerCheckpointsView.as_view(),
        name="api-trainer-checkpoints",
    ),
    path(
        "api/trainer/runs/<int:run_id>/evaluations/",
        TrainerEvaluationsView.as_view(),
        name="api-trainer-evaluations",
    ),
    path(
        "api/trainer/runs/<int:run_id>/datasets/<str:name>/versions/<int:number>/rows/",
        TrainerDatasetRowsView.as_view(),
        name="api-trainer-dataset-rows",
    ),
    path(
        "api/trainer/runs/<int:run_id>/traces/<int:trace_id>/",
        TrainerTraceUploadView.as_view(),
        name="api-trainer-trace-upload",
    ),
]

urlpatterns = pages + api + trainer_api

handler404 = "common.error_pages.not_found"
handler500 = "common.error_pages.server_error"
