"""The devices page in real Chromium against a real uvicorn, fed by step events posted as the trainer posts them."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from runs.services import run_claim_next
from tandem.contracts import ProducerReport, TrainerStepEvent, producers_key
from trainer.platform_client import PlatformClient

from .builders import device_report, step_event
from .test_dashboard_browser import chromium_page  # noqa: F401 - the fixture
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
    client = PlatformClient(server, trainer.raw_token)
    _post(client, running_run.pk, 3)
    _post(client, their_run.pk, 3)

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
