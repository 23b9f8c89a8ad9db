"""Series names that carry an environment's or a dataset's label fit the platform's 64 characters."""

from __future__ import annotations

import pytest

from tandem.contracts import (
    IDLE_CAUSES,
    METRIC_LABEL_LENGTH_MAX,
    METRIC_NAME_LENGTH_MAX,
    TrainerStepEvent,
    circuit_open_metric_name,
    device_metric_name,
    host_metric_name,
    idle_metric_name,
    metric_series_label,
    metric_series_name,
    trainer_process_metric_name,
)

# The registry allows environment and dataset names of 100 characters (Environment.name, Dataset.name);
# a label adds "@<version>".
LONGEST_NAME = 100
LONG_LABEL = "support-desk-" + "x" * (LONGEST_NAME - len("support-desk-")) + "@12"


def test_a_short_label_names_its_series_as_it_always_did():
    assert idle_metric_name("calculator@1", "environment") == "idle/calculator@1/environment_s"
    assert circuit_open_metric_name("calculator@1") == "producers/circuit_open/calculator@1"
    assert metric_series_name("eval", "guess@2", "success_rate") == "eval/guess@2/success_rate"


def test_a_label_of_the_longest_allowed_name_is_cut_to_fit_with_a_stable_hash():
    name = idle_metric_name(LONG_LABEL, "environment")

    assert len(name) <= METRIC_NAME_LENGTH_MAX
    # The same in every process and every release: 23 characters, then 8 hex digits of the label's SHA-256.
    assert metric_series_label(LONG_LABEL) == "support-desk-xxxxxxxxxx~33271747"
    assert name == "idle/support-desk-xxxxxxxxxx~33271747/environment_s"
    # Every series of the label holds it alike, so that they chart as one environment's.
    assert circuit_open_metric_name(LONG_LABEL) == "producers/circuit_open/support-desk-xxxxxxxxxx~33271747"


def test_a_label_of_up_to_32_characters_is_kept_whole():
    label = "x" * (METRIC_LABEL_LENGTH_MAX - 2) + "@1"
    assert metric_series_label(label) == label
    assert metric_series_label(label + "0") != label + "0"


def test_two_long_labels_that_share_their_start_name_two_series():
    first, second = LONG_LABEL, LONG_LABEL.replace("@12", "@13")
    for prefix, suffix in (("idle", "environment_s"), ("producers/circuit_open", ""), ("eval", "pass@1"),
                           ("rollout", "latency_p90_s")):
        assert metric_series_name(prefix, first, suffix) != metric_series_name(prefix, second, suffix)


def test_every_series_of_an_environment_of_the_longest_name_fits():
    event = TrainerStepEvent.model_validate({
        "run_id": 1, "step": 3, "phase": "rl", "policy_version": 2, "wall_s": 1.0, "wait_s": 0.5,
        "compute_s": 0.5, "publish_s": 0.0, "other_s": 0.0, "loss": 0.1, "emitted_at": 1.0,
        "idle_seconds": {LONG_LABEL: {cause: 0.1 for cause in IDLE_CAUSES}},
        "circuit_breakers_open": {LONG_LABEL: 1},
    })
    names = event.metric_values()

    assert len([name for name in names if name.startswith("idle/")]) == len(IDLE_CAUSES)
    assert circuit_open_metric_name(LONG_LABEL) in names
    assert max(len(name) for name in names) <= METRIC_NAME_LENGTH_MAX, max(names, key=len)


def test_evaluation_series_of_a_long_environment_or_dataset_fit():
    for label in (LONG_LABEL, f"dataset:{LONG_LABEL}"):
        for metric in ("success_rate", "pass@16", "avg@16", "reward_mean", "tokens_per_episode"):
            assert len(metric_series_name("eval", label, metric)) <= METRIC_NAME_LENGTH_MAX


def test_a_suffix_that_leaves_no_room_for_a_label_is_refused():
    with pytest.raises(ValueError, match="no room for a label"):
        metric_series_name("eval", LONG_LABEL, "m" * 30)


def test_device_host_and_trainer_series_are_named_from_the_reports_fields():
    assert device_metric_name("mfu") == "device/mfu"
    assert device_metric_name("device_count") == "device/count"
    assert device_metric_name("nvml_utilisation", device_id=3) == "device/3/nvml_utilisation"
    assert host_metric_name("host_cpu_percent") == "host/cpu_percent"
    assert trainer_process_metric_name("process_rss_bytes") == "trainer/rss_bytes"


@pytest.mark.parametrize(("name_of", "field"), [
    (device_metric_name, "hbm_bytes"), (host_metric_name, "cpu_percent"),
    (trainer_process_metric_name, "rss_bytes"), (lambda field: device_metric_name(field, device_id=0), "mfu"),
])
def test_a_field_the_device_report_does_not_chart_names_no_series(name_of, field):
    with pytest.raises(ValueError, match=repr(field)):
        name_of(field)
