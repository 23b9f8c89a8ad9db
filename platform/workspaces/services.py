"""Writes of the workspace: saved views and reports, by the project's writers (owners and members)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from accounts.models import Project
from accounts.permissions import project_require_writer
from common.domain_errors import Conflict, InvalidInput

from .models import Report, SavedView
from .view_state import WorkspaceView

MAX_REPORT_CHARS = 100_000


def _view_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise InvalidInput.for_field("name", "A saved view needs a name.")
    if len(name) > SavedView._meta.get_field("name").max_length:
        raise InvalidInput.for_field("name", "At most 100 characters.")
    return name


@transaction.atomic
def saved_view_save(*, user: AbstractBaseUser, project: Project, name: str, query: str,
                    replace: bool = False) -> SavedView:
    """Save the workspace ``query`` under ``name`` in the project (canonical: WorkspaceView.query());
    a name already taken is a Conflict unless ``replace``, which overwrites that view."""
    project_require_writer(user=user, project=project)
    name = _view_name(name)
    canonical = WorkspaceView.parse(query).query()
    existing = SavedView.objects.select_for_update().filter(project=project, name=name).first()
    if existing is not None:
        if not replace:
            raise Conflict(f"Project {project.pk} already has a view named '{name}'.", fields={
                "name": ["Taken: choose another name, or replace that view."]})
        existing.query = canonical
        existing.save(update_fields=["query", "updated_at"])
        return existing
    try:
        with transaction.atomic():
            return SavedView.objects.create(project=project, name=name, query=canonical, created_by=user)
    except IntegrityError:
        raise Conflict(f"Project {project.pk} already has a view named '{name}'.",
                       fields={"name": ["Taken by a view saved at the same moment."]}) from None


@transaction.atomic
def saved_view_update(*, user: AbstractBaseUser, view: SavedView, name: str | None = None,
                      query: str | None = None) -> SavedView:
    project_require_writer(user=user, project=view.project)
    if name is not None:
        view.name = _view_name(name)
        if SavedView.objects.filter(project=view.project, name=view.name).exclude(pk=view.pk).exists():
            raise Conflict(f"Project {view.project_id} already has a view named '{view.name}'.",
                           fields={"name": ["Taken: choose another name."]})
    if query is not None:
        view.query = WorkspaceView.parse(query).query()
    try:
        with transaction.atomic():
            view.save()
    except IntegrityError:
        raise Conflict(f"Project {view.project_id} already has a view named '{view.name}'.",
                       fields={"name": ["Taken by a view renamed at the same moment."]}) from None
    return view


def saved_view_delete(*, user: AbstractBaseUser, view: SavedView) -> None:
    project_require_writer(user=user, project=view.project)
    view.delete()


def _report_fields(title: str, body: str) -> tuple[str, str]:
    title = title.strip()
    if not title:
        raise InvalidInput.for_field("title", "A report needs a title.")
    if len(title) > Report._meta.get_field("title").max_length:
        raise InvalidInput.for_field("title", "At most 200 characters.")
    if len(body) > MAX_REPORT_CHARS:
        raise InvalidInput.for_field("body", f"At most {MAX_REPORT_CHARS:,} characters, not {len(body):,}.")
    return title, body


def report_create(*, user: AbstractBaseUser, project: Project, title: str, body: str) -> Report:
    project_require_writer(user=user, project=project)
    title, body = _report_fields(title, body)
    return Report.objects.create(project=project, title=title, body=body, created_by=user, updated_by=user)


def report_update(*, user: AbstractBaseUser, report: Report, title: str | None = None,
                  body: str | None = None) -> Report:
    project_require_writer(user=user, project=report.project)
    report.title, report.body = _report_fields(report.title if title is None else title,
                                               report.body if body is None else body)
    report.updated_by = user
    report.save()
    return report


def report_delete(*, user: AbstractBaseUser, report: Report) -> None:
    project_require_writer(user=user, project=report.project)
    report.delete()
