"""The dashboard's environment pages: the registry, one environment's versions and probe reports."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.selectors import project_get_for_user, project_list
from common.domain_errors import DomainError, NotFound
from tandem.contracts import TOOL_CALL_RATE_FIGURE

from .forms import EnvironmentRegisterForm
from .selectors import (
    environment_get_for_user,
    environment_list,
    environment_probe_list,
    environment_version_get,
)
from .serializers import EnvironmentRegisterSerializer
from .services import environment_probe_request, environment_register, probe_baseline_parse

# Probes shown per version on the page: the newest, health checks included.
PROBES_ON_PAGE = 20


@login_required
@require_http_methods(["GET", "POST"])
def environment_list_page(request):
    form = EnvironmentRegisterForm(request.POST or None, projects=project_list(user=request.user))
    if request.method == "POST" and form.is_valid():
        serializer = EnvironmentRegisterSerializer(data=form.api_body())
        if not serializer.is_valid():
            for field, errors in serializer.errors.items():
                form.add_error(field if field in form.fields else None, _flatten(errors))
        else:
            try:
                project = project_get_for_user(
                    user=request.user, project_id=int(form.cleaned_data["project"])
                )
                version = environment_register(
                    user=request.user,
                    project=project,
                    spec=serializer.to_spec(name=serializer.validated_data["name"]),
                    baseline=probe_baseline_parse(serializer.validated_data["baseline"]),
                )
            except DomainError as error:
                form.add_domain_error(error)
            else:
                messages.success(request, f"Registered {version}; its probe is running.")
                return redirect("environment-page", environment_id=version.environment_id)
    environments = environment_list(user=request.user)
    return render(request, "environments/list.html", {"environments": environments, "form": form})


@login_required
def environment_page(request, environment_id: int):
    environment = _environment_or_404(request, environment_id)
    versions = [
        {
            "version": version,
            "settings_json": json.dumps(version.settings, indent=2, sort_keys=True),
            "tools_json": json.dumps(version.tools, indent=2, sort_keys=True),
            "probes": [
                {"probe": probe, "checks": [_check_shown(check) for check in probe.checks],
                 "baseline": _baseline_shown(probe.baseline)}
                for probe in environment_probe_list(version=version)[:PROBES_ON_PAGE]
            ],
        }
        for version in environment.versions.all()
    ]
    return render(request, "environments/detail.html", {"environment": environment, "versions": versions})


@login_required
@require_POST
def environment_version_probe_page(request, environment_id: int, number: int):
    environment = _environment_or_404(request, environment_id)
    try:
        version = environment_version_get(environment=environment, number=number)
        environment_probe_request(version=version, purpose="manual", user=request.user)
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Probing {version} again.")
    return redirect("environment-page", environment_id=environment.pk)


def _check_shown(check: dict) -> dict:
    """A probe check with its latency in milliseconds: most checks take well under one."""
    latency_s = check.get("latency_s")
    return {**check, "latency_ms": None if latency_s is None else round(latency_s * 1000, 1)}


# The baseline's tool-use figures as the page lists them, with their labels (tandem.contracts.tool_use_metrics).
BASELINE_FIGURES = (
    (TOOL_CALL_RATE_FIGURE, "Tool-call rate"),
    ("tool_calls_per_episode", "Calls per episode"),
    ("answered_no_tools_rate", "Answered without a call"),
    ("tool_parse_failure_rate", "Call markup that did not parse"),
    ("unknown_tool_rate", "Calls of unknown tools"),
    ("invalid_arguments_rate", "Calls with invalid arguments"),
    ("tool_error_rate", "Calls the tool refused"),
)


def _baseline_shown(baseline: dict | None) -> dict | None:
    """A probe's baseline (tandem.contracts.ProbeBaseline as JSON) as rows of label, value and interval."""
    if baseline is None:
        return None
    tool_use, intervals = baseline.get("tool_use") or {}, baseline.get("tool_use_ci95") or {}
    rows = [{"label": label, "value": tool_use[name], "interval": intervals.get(name)}
            for name, label in BASELINE_FIGURES if name in tool_use]
    return {**baseline, "rows": rows}


def _environment_or_404(request, environment_id: int):
    try:
        return environment_get_for_user(user=request.user, environment_id=environment_id)
    except NotFound as error:
        raise Http404(error.message) from None


def _flatten(errors) -> str:
    if isinstance(errors, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in errors.items())
    if isinstance(errors, list):
        return "; ".join(_flatten(error) for error in errors if error)
    return str(errors)
