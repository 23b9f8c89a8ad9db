"""The dashboard's alert pages: a project's rules with a form to add one, and the user's notifications."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Membership
from accounts.selectors import project_get_for_user, project_list
from common.domain_errors import DomainError, Forbidden, NotFound

from .forms import AlertRuleForm
from .selectors import (
    alert_rule_get_for_user,
    alert_rule_list,
    notification_get_for_user,
    notification_list,
    webhook_url_as_seen,
)
from .services import (
    alert_rule_create,
    alert_rule_delete,
    alert_rule_update,
    notification_mark_read,
    notifications_mark_all_read,
)

# Notifications shown on the page: the newest.
NOTIFICATIONS_ON_PAGE = 200


@login_required
@require_http_methods(["GET", "POST"])
def alert_rule_list_page(request):
    form = AlertRuleForm(request.POST or None, projects=project_list(user=request.user))
    if request.method == "POST" and form.is_valid():
        try:
            project = project_get_for_user(user=request.user, project_id=int(form.cleaned_data["project"]))
            rule = alert_rule_create(user=request.user, project=project, **form.service_arguments())
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Alert rule '{rule.name}' created in {project.name}.")
            return redirect("alert-rule-list-page")
    rules = list(alert_rule_list(user=request.user))
    for rule in rules:  # viewers see where a webhook posts, never its URL whole
        rule.webhook_url_shown = webhook_url_as_seen(url=rule.webhook_url, role=rule.caller_role)
    return render(request, "alerts/rules.html", {"rules": rules, "form": form})


def _rule_or_404(request, rule_id: int):
    try:
        return alert_rule_get_for_user(user=request.user, rule_id=rule_id)
    except NotFound as error:
        raise Http404(error.message) from None


@login_required
@require_http_methods(["GET", "POST"])
def alert_rule_edit_page(request, rule_id: int):
    rule = _rule_or_404(request, rule_id)
    # The form holds the webhook URL whole, a credential viewers read redacted only: writers alone open it.
    if rule.caller_role not in Membership.WRITER_ROLES:
        raise PermissionDenied("Only the project's owners and members change its alert rules.")
    form = AlertRuleForm.for_rule(rule, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            alert_rule_update(user=request.user, rule=rule, changes=form.changes())
        except Forbidden as error:
            raise PermissionDenied(error.message) from None
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Alert rule '{form.cleaned_data['name']}' saved.")
            return redirect("alert-rule-list-page")
    return render(request, "alerts/edit.html", {"rule": rule, "form": form})


@login_required
@require_POST
def alert_rule_enabled_page(request, rule_id: int):
    """Turn a rule off (``enabled=0``) or on again, from the rules table."""
    rule = _rule_or_404(request, rule_id)
    enabled = request.POST.get("enabled") == "1"
    try:
        alert_rule_update(user=request.user, rule=rule, changes={"enabled": enabled})
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    messages.success(request, f"Alert rule '{rule.name}' {'enabled' if enabled else 'disabled'}.")
    return redirect("alert-rule-list-page")


@login_required
@require_POST
def alert_rule_delete_page(request, rule_id: int):
    try:
        rule = alert_rule_get_for_user(user=request.user, rule_id=rule_id)
    except NotFound as error:
        raise Http404(error.message) from None
    try:
        alert_rule_delete(user=request.user, rule=rule)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Alert rule '{rule.name}' deleted.")
    return redirect("alert-rule-list-page")


@login_required
def notification_list_page(request):
    notifications = notification_list(user=request.user)[:NOTIFICATIONS_ON_PAGE]
    return render(request, "alerts/notifications.html", {"notifications": notifications})


@login_required
@require_POST
def notification_read_page(request, notification_id: int):
    try:
        notification = notification_get_for_user(user=request.user, notification_id=notification_id)
    except NotFound as error:
        raise Http404(error.message) from None
    notification_mark_read(notification=notification)
    return redirect("notification-list-page")


@login_required
@require_POST
def notifications_read_all_page(request):
    marked = notifications_mark_all_read(user=request.user)
    messages.success(request, f"Marked {marked} notification{'s' if marked != 1 else ''} read.")
    return redirect("notification-list-page")
