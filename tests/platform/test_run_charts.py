"""The run page's charts and the trainer's stages, given to the pages as data (telemetry/charts.py)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from evaluations.services import evaluation_series_name
from tandem.contracts import (
    DATASET_EVALUATION_METRICS,
    EVALUATION_METRIC_PREFIX,
    EVALUATION_METRICS,
    IDLE_STAGE,
    TRAINER_STAGES,
    DeviceReport,
    DeviceSample,
    stage_metric_name,
)
from telemetry.charts import DEVICE_HISTORY_PANELS, RUN_CHARTS, SYSTEM_CHARTS, stage_styles

from .builders import full_rl_step_event


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _json_script(html: str, element_id: str):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no json_script {element_id} on the page"
    return json.loads(match.group(1))


def _python_pattern(javascript: str) -> re.Pattern:
    """A family's JavaScript pattern as Python reads it (named groups are spelt (?P<name>...))."""
    return re.compile(javascript.replace("(?<", "(?P<"))


def test_the_run_page_is_given_every_chart_as_data_in_page_order(browser, running_run):
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()

    charts = _json_script(html, "run-charts")

    assert [chart["id"] for chart in charts] == [chart["id"] for chart in RUN_CHARTS]
    for chart in charts:
        assert f'id="{chart["id"]}"' in html


def test_the_stage_chart_stacks_the_contracts_stages_in_the_order_a_step_runs_them():
    stages = next(chart for chart in RUN_CHARTS if chart["id"] == "chart-stages")

    assert [series["name"] for series in stages["series"]] == [
        stage_metric_name(stage.name) for stage in TRAINER_STAGES]
    assert [style["name"] for style in stage_styles() if style["idle"]] == [IDLE_STAGE]


def test_every_chart_finds_its_series_among_the_metrics_of_a_full_rl_step_or_an_evaluation(running_run):
    step_names = set(full_rl_step_event(running_run.pk, 1).metric_values())
    # What an evaluation with pass@1 and pass@4 records (evaluations.services), and a dataset's.
    evaluation_names = {f"{EVALUATION_METRIC_PREFIX}{name}" for name in (*EVALUATION_METRICS, "pass@1", "pass@4", "avg@1", "avg@4")}
    evaluation_names |= {evaluation_series_name(kind="dataset", label="support@1", metric=name)
                         for name in (*DATASET_EVALUATION_METRICS, "tokens", "tokens_cut", "wall_s")}
    evaluation_names |= {evaluation_series_name(kind="environment", label="guess@2", metric=name, own=False)
                         for name in (*EVALUATION_METRICS, "pass@1", "avg@1")}

    for chart in RUN_CHARTS:
        names = evaluation_names if chart.get("source") == "evaluations" else step_names
        fixed = {series["name"] for series in chart.get("series", ())
                 if not series.get("optional")} | ({chart["share_of"]} if "share_of" in chart else set())
        assert fixed <= names, chart["id"]
        family = chart.get("family")
        if family is not None:
            pattern = _python_pattern(family["pattern"])
            found = [pattern.match(name) for name in names if pattern.match(name)]
            assert found, chart["id"]
            variants = {value for value, _ in chart.get("variants", ())}
            assert not variants or {match.group("variant") for match in found} <= variants, chart["id"]
        assert fixed or family is not None or any(series["name"] in names for series in chart["series"])


def test_the_timeline_page_is_given_the_stages_and_the_statuses_it_polls_in(browser, running_run):
    html = browser.get(f"/runs/{running_run.pk}/timeline/").content.decode()

    assert _json_script(html, "timeline-stages") == stage_styles()
    assert set(_json_script(html, "tandem-contracts")["run_statuses"]["active"]) == {"queued", "starting", "running"}
    for stage in TRAINER_STAGES:
        assert f">{stage.name}" in html  # in the legend


def test_each_evaluation_chart_draws_its_own_kind_of_evaluation_series_only():
    own = evaluation_series_name(kind="environment", label="calculator@1", metric="success_rate")
    other = evaluation_series_name(kind="environment", label="guess@2", metric="success_rate", own=False)
    dataset = evaluation_series_name(kind="dataset", label="guess@2", metric="loss")
    charts = {chart["id"]: chart for chart in RUN_CHARTS}

    def draws(chart_id: str, name: str) -> bool:
        chart = charts[chart_id]
        family = chart.get("family")
        return (name in {series["name"] for series in chart.get("series", ())}
                or (family is not None and _python_pattern(family["pattern"]).match(name) is not None))

    assert [draws("chart-evaluation", name) for name in (own, other, dataset)] == [True, False, False]
    assert [draws("chart-evaluation-environments", name) for name in (own, other, dataset)] == [False, True, False]
    assert [draws("chart-evaluation-datasets", name) for name in (own, other, dataset)] == [False, False, True]


def _gpu_device_report() -> DeviceReport:
    """A report of a host of two GPUs with NVML, every figure known (as trainer.devices makes one on a GPU)."""
    gigabyte = 2**30
    devices = [DeviceSample(id=index, process_index=0, local_hardware_id=index, platform="gpu",
                            device_kind="NVIDIA H200", memory_in_use_bytes=40 * gigabyte,
                            memory_peak_bytes=60 * gigabyte, memory_limit_bytes=130 * gigabyte, duty_cycle=0.8,
                            mfu=0.3, nvml_index=index, nvml_utilisation=0.9) for index in range(2)]
    return DeviceReport(platform="gpu", device_kind="NVIDIA H200", device_count=2, local_device_count=2,
                        memory_in_use_bytes=80 * gigabyte, memory_peak_bytes=120 * gigabyte,
                        memory_limit_bytes=260 * gigabyte, duty_cycle=0.8, mfu=0.3, peak_flops_per_device=989e12,
                        gpu_utilisation=0.9, gpu_memory_used_bytes=90 * gigabyte, tpu_duty_cycle=None,
                        host_cpu_percent=35.0, host_memory_used_bytes=64 * gigabyte,
                        host_memory_total_bytes=128 * gigabyte, process_cpu_cores=1.5,
                        process_rss_bytes=9 * gigabyte, devices=devices, reported_at=1000.0)


def test_every_system_chart_and_device_panel_finds_its_series_in_a_gpu_hosts_reports(running_run):
    names = set(_gpu_device_report().metric_values()) | set(full_rl_step_event(running_run.pk, 1).metric_values())

    for chart in SYSTEM_CHARTS:
        fixed = {series["name"] for series in chart.get("series", ()) if not series.get("optional")}
        drawn = {series["name"] for series in chart.get("series", ())} & names
        assert fixed <= names, chart["id"]
        family = chart.get("family")
        if family is not None:
            assert any(_python_pattern(family["pattern"]).match(name) for name in names), chart["id"]
        assert drawn or family is not None, chart["id"]
    for panel in DEVICE_HISTORY_PANELS:
        glob = re.compile("^" + re.escape(panel["pattern"]).replace(r"\*", ".*") + "$")
        assert any(glob.match(name) for name in names), panel["pattern"]
