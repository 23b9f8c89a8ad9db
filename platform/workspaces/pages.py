"""The dashboard's workspace pages: a project's runs overlaid as a view selects them, and its reports."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Membership
from accounts.selectors import project_get_for_user, project_list
from common.domain_errors import DomainError, Forbidden, InvalidInput, NotFound
from runs.models import Run

from .forms import ReportForm
from .realtime import project_websocket_path
from .report_body import report_blocks
from .selectors import report_get_for_user, report_list, saved_view_list
from .services import report_create, report_delete, report_update
from .view_state import WorkspaceView


def _project_or_404(request, project_id: int):
    try:
        return project_get_for_user(user=request.user, project_id=project_id)
    except NotFound as error:
        raise Http404(error.message) from None


def _report_or_404(request, project_id: int, report_id: int):
    try:
        return report_get_for_user(user=request.user, project_id=project_id, report_id=report_id)
    except NotFound as error:
        raise Http404(error.message) from None


def _writer(project) -> bool:
    return project.role in Membership.WRITER_ROLES


@login_required
def workspace_home_page(request):
    """The first of the user's projects' workspaces (each workspace links to the others)."""
    project = project_list(user=request.user).first()
    if project is None:
        return render(request, "workspaces/no_project.html")
    return redirect("workspace-page", project_id=project.pk)


@login_required
def workspace_page(request, project_id: int):
    project = _project_or_404(request, project_id)
    try:
        WorkspaceView.parse(request.GET.urlencode())
    except InvalidInput as error:
        # The page still opens, on the defaults, and says what in its address it could not read.
        messages.error(request, f"This address holds no workspace view: {error.message}")
        return redirect("workspace-page", project_id=project.pk)
    return render(request, "workspaces/workspace.html", {
        "project": project, "projects": project_list(user=request.user),
        "saved_views": saved_view_list(project=project), "can_write": _writer(project),
        "websocket_path": project_websocket_path(project.pk),
        "reports": report_list(user=request.user, project=project)[:20], "statuses": Run.Status.choices,
    })


@login_required
@require_http_methods(["GET", "POST"])
def report_list_page(request, project_id: int):
    project = _project_or_404(request, project_id)
    form = ReportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            report = report_create(user=request.user, project=project, **form.cleaned_data)
        except Forbidden as error:
            raise PermissionDenied(error.message) from None
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Report '{report.title}' written.")
            return redirect("report-page", project_id=project.pk, report_id=report.pk)
    return render(request, "workspaces/reports.html", {
        "project": project, "reports": report_list(user=request.user, project=project), "form": form,
        "can_write": _writer(project), "saved_views": saved_view_list(project=project)})


@login_required
def report_page(request, project_id: int, report_id: int):
    report = _report_or_404(request, project_id, report_id)
    project = _project_or_404(request, project_id)
    return render(request, "workspaces/report.html", {
        "project": project, "report": report, "blocks": report_blocks(project=project, body=report.body),
        "can_write": _writer(project), "websocket_path": project_websocket_path(project.pk)})


@login_required
@require_http_methods(["GET", "POST"])
def report_edit_page(request, project_id: int, report_id: int):
    report = _report_or_404(request, project_id, report_id)
    project = _project_or_404(request, project_id)
    if not _writer(project):
        raise PermissionDenied(f"Your role in project '{project.name}' is {project.role}; it cannot edit reports.")
    form = ReportForm(request.POST or None, initial={"title": report.title, "body": report.body})
    if request.method == "POST" and form.is_valid():
        try:
            report_update(user=request.user, report=report, **form.cleaned_data)
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Report '{report.title}' saved.")
            return redirect("report-page", project_id=project.pk, report_id=report.pk)
    return render(request, "workspaces/report_edit.html", {
        "project": project, "report": report, "form": form, "saved_views": saved_view_list(project=project)})


@login_required
@require_POST
def report_delete_page(request, project_id: int, report_id: int):
    report = _report_or_404(request, project_id, report_id)
    try:
        report_delete(user=request.user, report=report)
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    messages.success(request, f"Report '{report.title}' deleted.")
    return redirect("report-list-page", project_id=project_id)
