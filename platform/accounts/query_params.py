"""Query parameters that name a project: checked to be the caller's before a view uses them."""

from __future__ import annotations

from accounts.selectors import project_get_for_user
from common.query_params import int_query_param


def project_query_param(request):
    """The project ``?project=<id>`` names, checked to be the caller's (404 if not), or None."""
    project_id = int_query_param(request, "project")
    if project_id is None:
        return None
    return project_get_for_user(user=request.user, project_id=project_id)
