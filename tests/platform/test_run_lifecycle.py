import pytest

from common.domain_errors import Conflict
from runs.models import Run
from runs.services import LEGAL_TRANSITIONS, run_transition
from tandem.contracts import TERMINAL_RUN_STATUSES

ALL_PAIRS = [(source, target) for source in Run.Status.values for target in Run.Status.values]
LEGAL = [
    ("queued", "starting"),
    ("queued", "cancelled"),
    ("queued", "failed"),
    ("starting", "running"),
    ("starting", "paused"),
    ("starting", "failed"),
    ("starting", "cancelled"),
    ("starting", "queued"),  # restarted: its trainer died before the first heartbeat
    ("running", "paused"),
    ("running", "finished"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "queued"),  # restarted: its trainer died (config.max_restarts)
    ("paused", "queued"),
    ("paused", "cancelled"),
    ("failed", "queued"),
]


def test_the_transition_table_is_exactly_the_documented_one():
    table = {
        (source, target) for source, targets in LEGAL_TRANSITIONS.items() for target in targets
    }
    assert table == set(LEGAL)


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_only_legal_transitions_are_made(make_run, source, target):
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status=source)

    if (source, target) in LEGAL:
        run_transition(run=run, to_status=target, reason="because")
        run.refresh_from_db()
        assert run.status == target and run.status_reason == "because"
        assert (run.started_at is not None) == (target == "running")
        assert (run.finished_at is not None) == (target in TERMINAL_RUN_STATUSES)
        if target == "queued":
            assert run.claimed_by == ""
    else:
        with pytest.raises(Conflict, match=f"is {source}; it cannot become {target}"):
            run_transition(run=run, to_status=target)
        run.refresh_from_db()
        assert run.status == source


def test_a_transition_judges_the_stored_status_not_a_stale_copy(make_run):
    run = make_run()
    stale = Run.objects.get(pk=run.pk)
    run_transition(run=run, to_status="cancelled")

    with pytest.raises(Conflict):
        run_transition(run=stale, to_status="starting")
    assert stale.status == "cancelled"
