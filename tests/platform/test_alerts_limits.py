"""What one project can make the platform post: a cap on its alert rules, and a cap on posts per
webhook URL per minute, whose excess deliveries are recorded as rate limited (issue 28, finding 12)."""

from __future__ import annotations

import pytest

from alerts.models import AlertRule, WebhookDelivery

from .test_alerts_webhooks import SECRET, _fail, eager_tasks, receiver  # noqa: F401 - the fixtures


@pytest.fixture(autouse=True)
def webhooks_to_localhost(settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


def _create(api, project, name: str, url: str = ""):
    body = {"project": project.pk, "name": name, "kind": "run_failed"}
    if url:
        body |= {"webhook_url": url, "webhook_secret": SECRET}
    return api.post("/api/alert-rules/", body, format="json")


def test_a_project_past_its_rule_cap_gets_a_400_naming_the_setting(api, project, settings):
    settings.TANDEM_MAX_ALERT_RULES_PER_PROJECT = 3
    assert AlertRule.objects.filter(project=project).count() == 1  # the tools_unused rule it starts with
    for index in range(2):
        assert _create(api, project, f"rule {index}").status_code == 201

    refused = _create(api, project, "one too many")

    assert refused.status_code == 400, refused.json()
    [message] = refused.json()["error"]["fields"]["project"]
    assert "TANDEM_MAX_ALERT_RULES_PER_PROJECT" in message and "3" in message
    assert AlertRule.objects.filter(project=project).count() == 3


def test_the_rule_cap_defaults_to_a_few_dozen(settings):
    assert 1 <= settings.TANDEM_MAX_ALERT_RULES_PER_PROJECT <= 50


def test_posts_past_the_per_url_rate_are_recorded_as_rate_limited_not_dropped(
    eager_tasks, receiver, api, project, running_run, settings, django_capture_on_commit_callbacks,  # noqa: F811
):
    settings.TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE = 2
    rules = [_create(api, project, f"hook {index}", receiver.url).json()["id"] for index in range(5)]
    _fail(running_run, django_capture_on_commit_callbacks)

    assert len(receiver.posts) == 2
    statuses = sorted(WebhookDelivery.objects.values_list("status", flat=True))
    assert statuses == ["delivered", "delivered", "rate_limited", "rate_limited", "rate_limited"]
    limited = WebhookDelivery.objects.filter(status="rate_limited").select_related("rule").first()
    assert "TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE" in limited.status_reason
    assert limited.finished_at is not None and limited.attempts == 0

    # Shown where deliveries are shown, and counted on the rule.
    [shown] = api.get(f"/api/alert-rules/{limited.rule_id}/deliveries/").json()["results"]
    assert shown["status"] == "rate_limited" and "per minute" in shown["status_reason"]
    counts = [api.get(f"/api/alert-rules/{rule}/").json()["deliveries"] for rule in rules]
    assert sum(count["rate_limited"] for count in counts) == 3
    assert sum(count["delivered"] for count in counts) == 2
