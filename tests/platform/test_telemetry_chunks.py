"""A step of thousands of episodes reaches the timeline whole, posted in chunks (issue 15, finding 7).

Before, a step event of about 7,400 or more episodes made a request body over Django's 2.5 MiB
cap: the post was refused on every try, and the run failed on every resume.
"""

from __future__ import annotations

import time

import pytest

from tandem.contracts import TrainerStepEvent
from telemetry.models import StepTimelineRecord
from trainer.platform_client import PlatformClient

from .builders import episode_span, timeline_event
from .conftest import TRAINER_NAME


def _big_step(run_id: int, step: int, episodes: int) -> TrainerStepEvent:
    t0 = time.time() - 60
    spans = [episode_span(f"g{index // 8}", index, started_at=t0 + index * 1e-3) for index in range(episodes)]
    return TrainerStepEvent.model_validate(timeline_event(run_id, step, started_at=t0, episodes=spans))


@pytest.mark.django_db(transaction=True)
def test_a_step_of_9000_episodes_is_stored_whole_through_the_real_server(server, running_run, trainer):
    events = [_big_step(running_run.pk, 1, 9000), _big_step(running_run.pk, 2, 5)]
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME, retries=0)

    client.post_events(running_run.pk, events)
    client.post_events(running_run.pk, events)  # a retried post places every chunk where it was
    client.close()

    big = StepTimelineRecord.objects.get(run=running_run, step=1)
    assert big.episode_count == 9000
    assert [span["trajectory_id"] for span in big.episodes] == [f"g{i // 8}-{i}" for i in range(9000)]
    assert StepTimelineRecord.objects.get(run=running_run, step=2).episode_count == 5


def _chunk(run_id: int, step: int, offset: int, count: int) -> dict:
    return {"run_id": run_id, "step": step, "offset": offset,
            "episodes": [episode_span("g", offset + index, started_at=1.0) for index in range(count)]}


def test_a_chunk_must_follow_its_steps_stored_episodes_and_is_refused_naming_the_field(trainer_api, running_run):
    url = f"/api/trainer/runs/{running_run.pk}/telemetry/"
    head = timeline_event(running_run.pk, 1, started_at=time.time() - 10,
                          episodes=[episode_span("g", 0, started_at=1.0)], episodes_total=3)
    assert trainer_api.post(url, {"events": [head]}, format="json").status_code == 202

    gap = trainer_api.post(url, {"events": [], "episode_chunks": [_chunk(running_run.pk, 1, 2, 1)]}, format="json")
    overrun = trainer_api.post(url, {"events": [], "episode_chunks": [_chunk(running_run.pk, 1, 1, 3)]},
                               format="json")
    # A step the run does not keep (pruned, or never drawn) takes its chunks and keeps nothing of them.
    unkept = trainer_api.post(url, {"events": [], "episode_chunks": [_chunk(running_run.pk, 9, 0, 1)]},
                              format="json")
    assert unkept.status_code == 202, unkept.content
    assert not StepTimelineRecord.objects.filter(run=running_run, step=9).exists()
    for refused, field in ((gap, "episode_chunks.0.offset"), (overrun, "episode_chunks.0.offset")):
        assert refused.status_code == 400, refused.content
        assert list(refused.json()["error"]["fields"]) == [field]

    filled = trainer_api.post(url, {"events": [], "episode_chunks": [_chunk(running_run.pk, 1, 1, 2)]},
                              format="json")
    assert filled.status_code == 202, filled.content
    record = StepTimelineRecord.objects.get(run=running_run, step=1)
    assert [span["trajectory_id"] for span in record.episodes] == ["g-0", "g-1", "g-2"]
