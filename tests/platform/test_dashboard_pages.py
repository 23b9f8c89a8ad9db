"""The dashboard's server-rendered pages: which actions a role sees, project scoping, filters."""

from __future__ import annotations

import pytest
from django.test import Client

from common.templatetags.vocabulary import EPISODE_STATUS_BADGES
from runs.models import Run
from runs.services import run_transition
from tandem.contracts import EPISODE_STATUSES

from .trajectory_builders import calculator_sample, post_body


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def browser(user) -> Client:
    return _logged_in(user)


def _rendered_actions(html: str) -> dict[str, bool]:
    """Each action form on the page, and whether it shows (False: hidden until the status allows it)."""
    actions = {}
    for action in ("pause", "resume", "cancel"):
        marker = f'<form id="{action}-form" data-action="{action}" method="post"'
        if marker in html:
            actions[action] = not html.split(marker, 1)[1].startswith(" hidden")
    return actions


def test_a_writer_sees_the_actions_the_runs_status_allows(browser, running_run):
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()
    assert _rendered_actions(html) == {"pause": True, "resume": False, "cancel": True}
    assert 'id="clone-link"' in html

    run_transition(run=running_run, to_status=Run.Status.PAUSED)
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()
    assert _rendered_actions(html) == {"pause": False, "resume": True, "cancel": True}

    run_transition(run=running_run, to_status=Run.Status.CANCELLED)
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()
    assert _rendered_actions(html) == {}  # nothing can happen to a cancelled run any more
    assert 'id="clone-link"' in html


def test_a_viewer_sees_no_actions_and_cannot_pause(make_user, make_project, make_run):
    viewer = make_user("vera")
    project = make_project(viewers=[viewer])
    run = make_run(project)
    client = _logged_in(viewer)

    html = client.get(f"/runs/{run.pk}/").content.decode()
    paused = client.post(f"/runs/{run.pk}/pause/")

    assert _rendered_actions(html) == {} and 'id="clone-link"' not in html
    assert paused.status_code == 403  # as over the API
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_pause_resume_and_clone_pages_of_another_users_run_are_not_found(browser, make_run):
    run = make_run()

    for path in ("pause/", "resume/", "clone/"):
        assert browser.post(f"/runs/{run.pk}/{path}").status_code == 404
    assert browser.get(f"/runs/{run.pk}/clone/").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and Run.objects.count() == 1


def test_a_clone_with_an_invalid_config_says_which_field(browser, running_run):
    response = browser.post(
        f"/runs/{running_run.pk}/clone/", {"name": "x", "config": '{"rollout": {"group_size": 1}}'}
    )

    assert response.status_code == 200
    assert "config.rollout.group_size" in response.content.decode()
    assert Run.objects.count() == 1


def test_the_trajectory_pages_of_another_project_are_not_found(
    trainer_api, make_user, running_run
):
    sample = calculator_sample(running_run.pk)
    trainer_api.post(f"/api/trainer/runs/{running_run.pk}/trajectories/", post_body(sample), format="json")
    stranger = _logged_in(make_user("mallory"))

    assert stranger.get(f"/runs/{running_run.pk}/trajectories/").status_code == 404
    assert stranger.get(f"/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/").status_code == 404


def test_the_trajectory_list_reports_a_bad_filter_and_shows_everything(browser, trainer_api, running_run):
    sample = calculator_sample(running_run.pk)
    trainer_api.post(f"/api/trainer/runs/{running_run.pk}/trajectories/", post_body(sample), format="json")

    html = browser.get(f"/runs/{running_run.pk}/trajectories/?min_reward=lots").content.decode()

    assert "min_reward: A valid number is required." in html
    assert sample.trajectory_id in html


def test_the_trajectory_pages_show_each_episode_status_as_its_own_badge(browser, trainer_api, running_run):
    samples = {status: calculator_sample(running_run.pk, status=status) for status in EPISODE_STATUSES}
    samples["truncated"] = samples["truncated"].model_copy(update={"failure_reason": "hit max_turns"})
    trainer_api.post(f"/api/trainer/runs/{running_run.pk}/trajectories/", post_body(*samples.values()),
                     format="json")

    listing = browser.get(f"/runs/{running_run.pk}/trajectories/").content.decode()
    badges = {status: browser.get(f"/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/").content.decode()
              for status, sample in samples.items()}

    # The filter offers every status of the contract, and the list badges each as its page does.
    for status in EPISODE_STATUSES:
        assert f'<option value="{status}" ' in listing
        assert listing.count(f'badge badge-{EPISODE_STATUS_BADGES[status]}">{status}</span>') == 1
        assert f'class="badge badge-{EPISODE_STATUS_BADGES[status]}">{status}</span>' in badges[status]
    assert "Truncated: hit max_turns" in badges["truncated"] and "Failed: tool calc" in badges["failed"]


def test_the_compare_page_charts_only_the_users_own_runs(browser, running_run, make_run):
    foreign = make_run()

    html = browser.get(f"/runs/compare/?runs={running_run.pk},{foreign.pk},oops").content.decode()

    assert f'"id": {running_run.pk}' in html and f'"id": {foreign.pk}' not in html
    assert 'id="compare-too-few"' in html


def test_the_run_list_refuses_an_unknown_sort_by_name(browser, running_run):
    html = browser.get("/runs/?sort=colour").content.decode()

    assert "sort: Unknown sort" in html and f'href="/runs/{running_run.pk}/"' in html


def test_the_trajectory_list_pages_keep_the_filters(browser, trainer_api, running_run):
    samples = [calculator_sample(running_run.pk, step=step, reward=1.0) for step in range(1, 53)]
    samples.append(calculator_sample(running_run.pk, step=60, status="failed", why="failed"))
    response = trainer_api.post(
        f"/api/trainer/runs/{running_run.pk}/trajectories/", post_body(*samples), format="json"
    )
    assert response.status_code == 202

    first = browser.get(f"/runs/{running_run.pk}/trajectories/?status=ok").content.decode()
    second = browser.get(f"/runs/{running_run.pk}/trajectories/?status=ok&page=2").content.decode()

    assert first.count('class="trajectory-row"') == 50 and "page 1 of 2 · 52 trajectories" in first
    assert 'href="?status=ok&amp;page=2"' in first
    assert second.count('class="trajectory-row"') == 2
    assert samples[0].trajectory_id in second and samples[-1].trajectory_id not in first + second
