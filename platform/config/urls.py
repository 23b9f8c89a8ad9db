"""Every HTTP route of the platform: pages, then the API (users', then the trainer's)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from accounts.views import ProjectListCreateView
from config.api_root import ApiRootView
from environments.views import EnvironmentListCreateView
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
from telemetry.views import (
    RunDevicesView,
    RunMetricsView,
    RunTraceDownloadView,
    RunTraceListCreateView,
    TrainerTelemetryView,
    TrainerTraceUploadView,
)

pages = [
    path("", RedirectView.as_view(pattern_name="run-list-page", permanent=False)),
    path("login/", auth_views.LoginView.as_view(template_name="accounts/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", run_pages.run_list_page, name="run-list-page"),
    path("runs/<int:run_id>/", run_pages.run_page, name="run-page"),
    path("runs/<int:run_id>/cancel/", run_pages.run_cancel_page, name="run-cancel-page"),
    path("admin/", admin.site.urls),
]

api = [
    path("api/", ApiRootView.as_view(), name="api-root"),
    path("api/projects/", ProjectListCreateView.as_view(), name="api-projects"),
    path("api/environments/", EnvironmentListCreateView.as_view(), name="api-environments"),
    path("api/runs/", RunListCreateView.as_view(), name="api-runs"),
    path("api/runs/<int:run_id>/", RunDetailView.as_view(), name="api-run-detail"),
    path("api/runs/<int:run_id>/cancel/", RunCancelView.as_view(), name="api-run-cancel"),
    path("api/runs/<int:run_id>/pause/", RunPauseView.as_view(), name="api-run-pause"),
    path("api/runs/<int:run_id>/resume/", RunResumeView.as_view(), name="api-run-resume"),
    path("api/runs/<int:run_id>/clone/", RunCloneView.as_view(), name="api-run-clone"),
    path("api/runs/<int:run_id>/metrics/", RunMetricsView.as_view(), name="api-run-metrics"),
    path("api/runs/<int:run_id>/devices/", RunDevicesView.as_view(), name="api-run-devices"),
    path("api/runs/<int:run_id>/traces/", RunTraceListCreateView.as_view(), name="api-run-traces"),
    path(
        "api/runs/<int:run_id>/traces/<int:trace_id>/download/",
        RunTraceDownloadView.as_view(),
        name="api-run-trace-download",
    ),
    path("api/run-config/schema/", RunConfigSchemaView.as_view(), name="api-run-config-schema"),
]

trainer_api = [
    path("api/", ApiRootView.as_view(), name="api-root"),
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
        "api/trainer/runs/<int:run_id>/traces/<int:trace_id>/",
        TrainerTraceUploadView.as_view(),
        name="api-trainer-trace-upload",
    ),
]

urlpatterns = pages + api + trainer_api
