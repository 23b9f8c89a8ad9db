"""The devices page in real Chromium against a real uvicorn, fed by step events posted as the trainer posts them."""

from __future__ import annotations

import re
import time
from urllib.parse import urlsplit

import psutil
import pytest
from playwright.sync_api import expect

from runs.services import run_claim_next, run_transition
from tandem.contracts import (
    ProcessReport,
    ProducerReport,
    RunStatus,
    TrainerStepEvent,
    process_reports_key,
    producers_key,
)
from telemetry.services import metric_events_record
from trainer.platform_client import PlatformClient

from .builders import device_report, full_rl_step_event, step_event
from .conftest import TRAINER_NAME
from .test_dashboard_browser import chromium_page  # noqa: F401 - the fixture
from .test_dashboard_fixes_browser import open_page  # noqa: F401 - the fixture (fails on console errors too)
from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = REPO_ROOT / "test-artifacts" / "devices.png"


def _post(client: PlatformClient, run_id: int, step: int, **report) -> None:
    event = TrainerStepEvent.model_validate(step_event(run_id, step, device=device_report(**report)))
    client.post_events(run_id, [event])


def test_the_devices_page_shows_a_row_per_device_and_follows_new_reports(
    server, chromium_page, running_run, trainer, make_run, make_project, make_environment, make_user,  # noqa: F811
    redis_client,
):
    redis_client.delete(producers_key(running_run.pk))
    producer = ProducerReport(worker="rollouts-1@gpu-host-2:311", reported_at=time.time(), uptime_s=60.0,
                              busy_s=55.0, running_tasks=3, cpu_s=48.2, rss_bytes=1536 * 2**20)
    redis_client.hset(producers_key(running_run.pk), producer.worker, producer.model_dump_json())
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project), name="not-alices")
    assert run_claim_next(worker="trainer-host:9").pk == their_run.pk  # active too, but not alice's
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    their_trainer = PlatformClient(server, trainer.raw_token, trainer_name="trainer-host:9")
    _post(client, running_run.pk, 3)
    _post(their_trainer, their_run.pk, 3)
    their_trainer.close()

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = chromium_page(server, "/devices/")
    run_card = page.locator(f".device-run[data-run-id='{running_run.pk}']")
    rows = run_card.locator(".device-row")
    expect(rows).to_have_count(4)
    assert page.locator(".device-run").count() == 1  # another user's run is not listed
    assert rows.evaluate_all("rows => rows.map(row => row.dataset.deviceId)") == ["0", "1", "2", "3"]
    third = rows.nth(2)
    assert "NVIDIA H100 80GB HBM3" in third.locator(".device-name").inner_text()
    assert third.locator(".device-duty").inner_text().strip() == "62.0%"
    assert third.locator(".memory-in-use").inner_text().strip() == "12.0 GiB in use"
    assert third.locator(".memory-peak-limit").inner_text().strip() == "peak 22.0 GiB · limit 76.0 GiB"
    assert third.locator(".nvml-utilisation").inner_text().strip() == "70.0% busy"
    assert third.locator(".nvml-memory").inner_text().strip() == "NVML #2 · 14.0 GiB of 80.0 GiB"
    assert third.locator(".device-mfu").inner_text().strip() == "41.0%"
    assert "gpu-host-1" in third.locator(".device-host").inner_text()
    facts = run_card.locator(".device-host-facts").inner_text()
    assert "37%" in facts and "1.50 cores" in facts and "6.0 GiB" in facts
    # The duty-cycle bar is as wide as its figure.
    width = third.locator(".device-duty .meter-fill").evaluate("fill => fill.style.width")
    assert width == "62%"
    assert run_card.locator("a.device-run-link").get_attribute("href") == f"/runs/{running_run.pk}/"
    producer_row = run_card.locator(".producer-row")
    expect(producer_row).to_have_count(1)
    assert producer_row.locator("td").all_inner_texts()[:4] == ["rollouts-1@gpu-host-2:311", "3", "48.2 s", "1.5 GiB"]
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # A newer report from a trainer on CPU: the page follows it without a reload, and says what is not reported.
    cpu_rows = [{"id": index, "process_index": 0, "local_hardware_id": index, "platform": "cpu",
                 "device_kind": "cpu", "duty_cycle": 0.5} for index in range(2)]
    _post(client, running_run.pk, 4, platform="cpu", device_kind="cpu", device_count=2, local_device_count=2,
          devices=cpu_rows, mfu=None, peak_flops_per_device=None, memory_in_use_bytes=None, duty_cycle=0.5)
    client.close()
    redis_client.delete(producers_key(running_run.pk))
    expect(rows).to_have_count(2, timeout=15_000)
    expect(run_card.locator(".device-report-age")).to_have_text(re.compile("report of step 4"))
    first = rows.nth(0)
    assert first.locator(".device-duty").inner_text().strip() == "50.0%"
    for cell in (".device-memory", ".device-driver", ".device-mfu"):
        assert first.locator(cell).inner_text().strip() == "not reported", cell
    assert page.evaluate("window.tandemDevices.polls") >= 1
    page.screenshot(path=str(SCREENSHOT.with_name("devices-cpu.png")), full_page=True)


def _uvicorn_pid(server: str) -> int:
    """The pid of the `server` fixture's uvicorn: the child of this test process that serves its port."""
    port = str(urlsplit(server).port)
    (process,) = [child for child in psutil.Process().children()
                  if "uvicorn" in child.cmdline() and port in child.cmdline()]
    return process.pid


def test_the_devices_page_lists_every_tandem_process_and_follows_new_ones(
    server, chromium_page, running_run, make_run, make_project, make_environment, make_user, redis_client,  # noqa: F811
):
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project), name="not-alices")
    now = time.time()
    # A rollout worker on another host, as its reporter writes it; a long interval keeps it
    # live however slowly the browser starts on a busy machine.
    worker = ProcessReport(
        role="rollout_worker", name="rollouts-1@gpu-host-2", hostname="gpu-host-2", pid=311, started_at=now - 7200,
        reported_at=now, interval_s=300.0, cpu_cores=3.5, rss_bytes=1536 * 2**20, host_cpu_count=16,
        host_cpu_percent=42.0, host_memory_used_bytes=24 * 2**30, host_memory_total_bytes=64 * 2**30,
        run_ids=[running_run.pk, their_run.pk],
    )
    trainer = worker.model_copy(update={"role": "trainer", "name": "", "pid": 312, "cpu_cores": 1.0,
                                        "run_ids": [running_run.pk]})
    fields = [worker.field, trainer.field]
    redis_client.hdel(process_reports_key(), *fields)
    redis_client.hset(process_reports_key(), worker.field, worker.model_dump_json())
    # The same worker's report on the run it produces for, as workers/activity.py names it: hostname:pid.
    redis_client.delete(producers_key(running_run.pk))
    producer = ProducerReport(worker="gpu-host-2:311", reported_at=now, uptime_s=7000.0, busy_s=6000.0,
                              running_tasks=2, cpu_s=9000.0, rss_bytes=1536 * 2**20)
    redis_client.hset(producers_key(running_run.pk), producer.worker, producer.model_dump_json())
    web_pid = _uvicorn_pid(server)

    try:
        # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
        page = chromium_page(server, "/devices/")
        table = page.locator("#processes table.processes")
        # The web server that serves this page reported itself (ASGI lifespan) as it started.
        web_row = table.locator(f".process-row[data-role='web'][data-pid='{web_pid}']")
        expect(web_row).to_have_count(1)
        assert "web server" in web_row.locator(".process-role").inner_text()
        assert re.fullmatch(r"\d+\.\d\d of \d+ cores", web_row.locator(".process-cpu .meter-value").inner_text())
        assert re.search(r"MiB|GiB", web_row.locator(".process-rss").inner_text())

        row = table.locator(".process-row[data-role='rollout_worker'][data-pid='311']")
        expect(row).to_have_count(1)
        role = row.locator(".process-role").inner_text()
        assert "rollout worker" in role and "rollouts-1@gpu-host-2" in role
        assert row.locator(".process-host").inner_text().split("\n") == ["gpu-host-2", "pid 311"]
        assert row.locator(".process-uptime").inner_text() == "2.0 h"
        assert row.locator(".process-cpu").inner_text().strip() == "3.50 of 16 cores"
        # The CPU bar is the process's share of its host's cores.
        assert row.locator(".process-cpu .meter-fill").evaluate("fill => fill.style.width") == "21.875%"
        assert row.locator(".process-rss").inner_text() == "1.5 GiB"
        assert row.locator(".process-host-cpu").inner_text().strip() == "42%"
        assert row.locator(".process-host-memory").inner_text().strip() == "24.0 GiB of 64.0 GiB"
        # Alice's run is named and linked; the stranger's is only counted.
        runs = row.locator(".process-runs")
        assert runs.locator("a").get_attribute("href") == f"/runs/{running_run.pk}/"
        assert runs.locator("a").inner_text() == f"run {running_run.pk}"
        assert runs.locator(".process-other-runs").inner_text() == "1 run of other projects"
        # The run's producer table shows the same process's CPU now, not only its CPU seconds since it started.
        producer_row = page.locator(f".device-run[data-run-id='{running_run.pk}'] .producer-row")
        assert producer_row.locator("td").all_inner_texts() == [
            "gpu-host-2:311", "2", "9000.0 s", "1.5 GiB", producer_row.locator("td").nth(4).inner_text(),
            "3.50 cores"]
        # Rows by role: web, platform worker, rollout workers, trainers.
        roles = table.locator(".process-row").evaluate_all("rows => rows.map(row => row.dataset.role)")
        assert roles.index("web") < roles.index("rollout_worker")

        # A trainer starts: it shows up at the next refresh, without a reload.
        redis_client.hset(process_reports_key(), trainer.field, trainer.model_dump_json())
        trainer_row = table.locator(".process-row[data-role='trainer'][data-pid='312']")
        expect(trainer_row).to_have_count(1, timeout=15_000)
        assert trainer_row.locator(".process-runs").inner_text().strip() == f"run {running_run.pk}"
        page.screenshot(path=str(SCREENSHOT.with_name("devices_processes.png")), full_page=True)
    finally:
        redis_client.hdel(process_reports_key(), *fields)
        redis_client.delete(producers_key(running_run.pk))


PRODUCER = "rollouts-1@gpu-host-2:311"  # the producer process of builders.full_rl_step_event


def _panel(page, pattern: str) -> dict:
    return page.evaluate("""(pattern) => { const p = window.tandemExplorer.panels.find((p) => p.pattern === pattern);
        return {names: p.names, points: p.points, drawn: p.plot !== null}; }""", pattern)


def test_a_finished_runs_devices_host_and_producers_are_charted_over_time(
    server, open_page, running_run, make_run, project, environment,  # noqa: F811
):
    metric_events_record(run=running_run, events=[full_rl_step_event(running_run.pk, step) for step in (1, 2, 3)])
    run_transition(run=running_run, to_status=RunStatus.FINISHED, reason="done")
    queued = make_run(project, environment=environment, name="waiting")  # newer, and active: picked first

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = open_page(server, "/devices/")
    picker = page.locator("#device-history-run")
    options = picker.locator("option")
    assert options.evaluate_all("options => options.map(o => [o.value, o.dataset.active, o.selected])") == [
        [str(queued.pk), "true", True], [str(running_run.pk), "false", False]]
    assert options.nth(0).inner_text().startswith("● waiting")

    # Picking the finished run shows its charts; the live snapshot of active runs stays on the page.
    picker.select_option(str(running_run.pk))
    page.wait_for_url(f"**/devices/?run={running_run.pk}")
    page.wait_for_function("() => window.tandemExplorer && window.tandemExplorer.ready")
    expect(page.locator("#devices-empty")).to_be_visible()  # no run is on a trainer now
    assert page.locator(".explorer-panel").count() == 10
    use = _panel(page, "device/*/nvml_utilisation")
    assert use["names"] == [f"device/{index}/nvml_utilisation" for index in range(4)]
    assert use["points"] == [3, 3, 3, 3] and use["drawn"]
    memory = _panel(page, "device/*/memory_in_use_bytes")
    assert memory["names"] == [f"device/{index}/memory_in_use_bytes" for index in range(4)] and memory["drawn"]
    assert _panel(page, "host/cpu_percent")["points"] == [3]
    cores = _panel(page, "*/cpu_cores")
    assert cores["names"] == ["producers/cpu_cores", f"producers/{PRODUCER}/cpu_cores", "trainer/cpu_cores"]
    assert cores["points"] == [3, 3, 3]
    assert _panel(page, "producers/*utilisation")["names"] == [f"producers/{PRODUCER}/utilisation"]
    assert f"producers/{PRODUCER}/rss_bytes" in _panel(page, "*/rss_bytes")["names"]
    # The devices page's panels are its own: nothing is saved over the user's run-page layout.
    assert page.evaluate("window.tandemExplorer.savesAsked") == 0
    page.screenshot(path=str(SCREENSHOT.with_name("devices_over_time.png")), full_page=True)
