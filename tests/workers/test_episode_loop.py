"""A producer process's episode loop: every task thread's episodes run on one loop and share its clients and HTTP session."""

from __future__ import annotations

import asyncio
import threading

import pytest

from environments.adapters.http import shared_http_session
from workers.episode_loop import EpisodeLoop


def test_tasks_of_several_threads_run_on_one_loop_with_the_shared_session(redis_url):
    loop = EpisodeLoop()
    seen = []

    async def task(number: int):
        await asyncio.sleep(0.05)
        client = loop.redis(redis_url)
        await client.set(f"tandem:test:episode-loop:{number}", number)
        value = int(await client.get(f"tandem:test:episode-loop:{number}"))
        await client.delete(f"tandem:test:episode-loop:{number}")
        return asyncio.get_running_loop(), shared_http_session.get(), threading.current_thread().name, value

    threads = [threading.Thread(target=lambda n=n: seen.append(loop.run(task(n)))) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(seen) == 4
    assert len({id(event_loop) for event_loop, *_ in seen}) == 1
    assert all(shared is loop.http_session for _, shared, _, _ in seen)
    assert {name for _, _, name, _ in seen} == {"episode-loop"}
    assert sorted(value for *_, value in seen) == [0, 1, 2, 3]
    assert shared_http_session.get() is None  # the callers' own context is untouched


def test_an_exception_reaches_the_task_that_ran_the_coroutine():
    loop = EpisodeLoop()

    async def fails():
        raise ValueError("environment class not found")

    with pytest.raises(ValueError, match="environment class not found"):
        loop.run(fails())
    assert loop.run(asyncio.sleep(0, result="still serving")) == "still serving"


def test_waiting_on_the_loop_from_the_loop_itself_is_refused():
    loop = EpisodeLoop()

    async def nested():
        return loop.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own thread"):
        loop.run(nested())


def test_a_coroutine_past_its_timeout_is_cancelled():
    loop = EpisodeLoop()
    cancelled = threading.Event()

    async def stuck():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError, match="cancelled after 0.2s"):
        loop.run(stuck(), timeout_s=0.2)
    assert cancelled.wait(5)
