"""The progress watchdog: a run whose trainer heartbeats but no longer trains is flagged (real PostgreSQL)."""

from datetime import timedelta

from django.utils import timezone

from runs.models import Run
from runs.services import run_heartbeat, runs_flag_stalled
from runs.tasks import flag_stalled_runs
from tandem.contracts import TrainerHeartbeat

from .conftest import TRAINER_NAME


def _no_progress_for(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(progress_at=timezone.now() - timedelta(seconds=seconds))


def test_a_running_run_whose_step_stands_still_past_its_stall_timeout_is_flagged_then_cleared(running_run):
    """Before, a trainer that heartbeat without making progress kept its run "running" forever, unflagged."""
    Run.objects.filter(pk=running_run.pk).update(config={**running_run.config, "stall_timeout_s": 300})
    _no_progress_for(running_run, 200)
    assert runs_flag_stalled() == []

    _no_progress_for(running_run, 400)
    # Heartbeats that keep the run alive but do not move its step change nothing.
    run_heartbeat(run=running_run, heartbeat=TrainerHeartbeat(worker=TRAINER_NAME, trainer_step=0))
    assert [run.pk for run in runs_flag_stalled()] == [running_run.pk]
    running_run.refresh_from_db()
    assert running_run.status == "running" and running_run.stalled_since is not None
    assert flag_stalled_runs() == []  # flagged once

    run_heartbeat(run=running_run, heartbeat=TrainerHeartbeat(worker=TRAINER_NAME, trainer_step=1))
    running_run.refresh_from_db()
    assert running_run.stalled_since is None and running_run.trainer_step == 1


def test_the_stall_shows_in_the_api_and_on_the_run_page(api, running_run):
    _no_progress_for(running_run, 4000)  # past the default stall_timeout_s of 1800 s
    runs_flag_stalled()

    assert api.get(f"/api/runs/{running_run.pk}/").json()["stalled_since"] is not None
    api.force_login(running_run.project.memberships.first().user)
    page = api.get(f"/runs/{running_run.pk}/").content.decode()
    assert '<p id="run-stalled" class="error">' in page and "No progress since" in page


def test_a_run_that_is_not_running_is_never_flagged(running_run):
    _no_progress_for(running_run, 4000)
    Run.objects.filter(pk=running_run.pk).update(status="paused")
    assert runs_flag_stalled() == []
