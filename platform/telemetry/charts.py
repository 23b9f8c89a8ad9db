"""The run page's charts and the trainer stages' colours, defined once and given to the pages as data.

The run page's scripts (run_page/charts.js) draw whatever charts :data:`RUN_CHARTS` lists, in that order, and
the run timeline draws its trainer lane with :func:`stage_styles`; neither
script knows a metric or stage name of its own. A chart is a JSON object:

- ``id``, ``title``, ``caption``, ``empty``: the figure's element id and texts
  (``empty`` shows until the chart has a point);
- ``empty_configured``: ``[config path, text]``, the text shown instead of ``empty``
  on a run whose config sets that dotted path (:func:`run_charts`): an evaluation
  chart tells a run that evaluates when its first evaluation comes, not how to ask for one;
- ``variants``: ``[value, label]`` pairs of a select that picks which family of
  series the chart draws (the first at first), matched by the ``variant`` group
  of ``family.pattern``;
- ``kind``: ``lines`` (when ``smooth``, each series smoothed, its raw values
  drawn faint behind it) or ``stacked`` (areas, each on top of the one below;
  ``share_of`` a metric makes them shares of it, ``percent`` labels them so);
- ``series``: fixed series ``{name, label, colour, scale, optional}``: ``colour``
  a palette index (``tandem/charts.js``) or a CSS colour; an ``optional`` series
  is drawn once its metric has been seen; a ``scale`` other than ``y`` gets an
  axis of its own on the right;
- ``family``: series found among the metric names as they come, for metrics
  named per environment or per bucket: ``pattern`` (a JavaScript regular
  expression with named groups ``environment``, ``variant``, ``order``),
  ``label`` (a template of those groups; ``label_one`` instead where ``order`` is 1,
  for "1 version" beside "2 versions"), ``colour`` (``environment``: one
  colour per environment, the same on every chart; ``gradient``: green to red
  in ``order``), and ``dash`` by ``order``. Series sort by environment, then by
  ``order`` as a number ("4+" after 4);
- ``range`` (fixed y range), ``range_min`` (the y axis starts at or below it),
  ``min_span`` (the smallest y span drawn);
- ``source``: ``evaluations`` for a chart of the run's held-out evaluations
  (``eval/<metric>``, another environment's ``eval/<name@version>/<metric>``, a
  dataset's ``eval/dataset:<name@version>/<metric>``, recorded when an evaluation
  ends, not by step events).
"""

from __future__ import annotations

from tandem.contracts import (
    DATASET_SERIES_LABEL_PREFIX,
    DEVICE_SERIES_PREFIX,
    EVALUATION_MEAN_REWARD,
    EVALUATION_METRIC_PREFIX,
    EVALUATION_SUCCESS_RATE,
    IDLE_CAUSES,
    IDLE_STAGE,
    LOSS_METRIC,
    PADDING_FRACTION_METRIC,
    POLICY_VERSION_METRIC,
    PRODUCER_FIGURES,
    PRODUCERS_SERIES_PREFIX,
    REWARD_MEAN_METRIC,
    SAMPLES_PER_S_METRIC,
    SAMPLES_PRODUCED_PER_S_METRIC,
    SUCCESS_RATE_METRIC,
    TOKENS_PER_S_METRIC,
    TRAINER_STAGES,
    device_metric_name,
    host_metric_name,
    producers_metric_name,
    stage_metric_name,
    trainer_process_metric_name,
)

# One colour per trainer stage, on the run page's stage chart and the timeline alike.
# The timeline hatches the idle stage instead (a pattern in this colour's red).
STAGE_COLOURS = {
    "data_wait": "#f87171",
    "batch": "#14b8a6",
    "host_to_device": "#0891b2",
    "compute": "#16a34a",
    "publish": "#6366f1",
    "checkpoint": "#a16207",
    "telemetry": "#94a3b8",
    "other": "#d1d5db",
}
if set(STAGE_COLOURS) != {stage.name for stage in TRAINER_STAGES}:
    raise AssertionError("every trainer stage needs a colour, and only trainer stages have one")


def stage_styles() -> list[dict]:
    """The trainer's stages in step order, as the pages draw them."""
    return [
        {"name": stage.name, "label": stage.name.replace("_", " "), "colour": STAGE_COLOURS[stage.name],
         "idle": stage.name == IDLE_STAGE, "meaning": stage.meaning}
        for stage in TRAINER_STAGES
    ]


# Devices, host and processes over time, from the DeviceReport of every device_report_interval_s and the
# producers' reports differenced at every step; metric points of the run, so kept after it ends.
SYSTEM_CHARTS: list[dict] = [
    {
        "id": "chart-device-use", "title": "Device use", "empty": "No device report yet.",
        "caption": "duty cycle (compute / wall), MFU (model FLOPs over the peak: a data sheet's, or on a CPU a "
                   "measured matmul's), and each GPU's NVML busy share where reported",
        "kind": "lines", "smooth": False, "range_min": 0, "min_span": 0.1,
        "series": [
            {"name": device_metric_name("duty_cycle"), "label": "duty cycle", "colour": 0},
            {"name": device_metric_name("mfu"), "label": "MFU", "colour": 1, "optional": True},
            {"name": device_metric_name("tpu_duty_cycle"), "label": "TPU duty cycle", "colour": 3, "optional": True},
        ],
        "family": {"pattern": rf"^{DEVICE_SERIES_PREFIX}(?<environment>\d+)/nvml_utilisation$",
                   "label": "device {environment} busy",
                   "colour": "environment"},
    },
    {
        "id": "chart-device-memory", "title": "Device memory", "empty": "No device memory reported (CPU has none).",
        "caption": "bytes in use by XLA's allocator, per device and summed, with the peak and the limit",
        "kind": "lines", "smooth": False, "range_min": 0,
        "series": [
            {"name": device_metric_name("memory_in_use_bytes"), "label": "in use, all devices", "colour": 0, "optional": True},
            {"name": device_metric_name("memory_peak_bytes"), "label": "peak", "colour": 5, "optional": True},
            {"name": device_metric_name("memory_limit_bytes"), "label": "limit", "colour": 6, "optional": True},
        ],
        "family": {"pattern": rf"^{DEVICE_SERIES_PREFIX}(?<environment>\d+)/memory_in_use_bytes$",
                   "label": "device {environment}",
                   "colour": "environment"},
    },
    {
        "id": "chart-host", "title": "Host and trainer CPU", "empty": "No device report yet.",
        "caption": "the trainer host's CPU use (%) and the trainer process's cores (right axis)",
        "kind": "lines", "smooth": False, "range_min": 0,
        "series": [
            {"name": host_metric_name("host_cpu_percent"), "label": "host CPU %", "colour": 0},
            {"name": trainer_process_metric_name("process_cpu_cores"), "label": "trainer cores (right axis)", "colour": 1, "scale": "cores"},
        ],
    },
    {
        "id": "chart-host-memory", "title": "Host and process memory", "empty": "No device report yet.",
        "caption": "the trainer host's memory in use, the trainer's and the producers' resident memory",
        "kind": "lines", "smooth": False, "range_min": 0,
        "series": [
            {"name": host_metric_name("host_memory_used_bytes"), "label": "host in use", "colour": 0},
            {"name": trainer_process_metric_name("process_rss_bytes"), "label": "trainer RSS", "colour": 1},
            {"name": producers_metric_name("rss_bytes"), "label": "producers RSS", "colour": 2, "optional": True},
        ],
    },
    {
        "id": "chart-producers", "title": "Producer processes", "empty": "No producer report yet.",
        "caption": "each rollout producer process (worker@host:pid) over the steps",
        "variants": [["utilisation", "busy share"], ["cpu_cores", "CPU cores"], ["rss_bytes", "resident memory"]],
        "kind": "lines", "smooth": False, "range_min": 0,
        "family": {"pattern": rf"^{PRODUCERS_SERIES_PREFIX}(?<environment>.+)/(?<variant>{'|'.join(PRODUCER_FIGURES)})$",
                   "label": "{environment}", "colour": "environment"},
    },
]

# The same figures on the devices page, as metric explorer panels of one picked run (a glob per panel,
# `*` crossing `/`): one unit per panel, so that the trainer's and every producer's cores share an axis.
DEVICE_HISTORY_PANELS: list[dict] = [
    {"pattern": pattern, "x_axis": "step"}
    for pattern in (
        f"{DEVICE_SERIES_PREFIX}*duty_cycle", f"{DEVICE_SERIES_PREFIX}*/nvml_utilisation", device_metric_name("mfu"),
        f"{DEVICE_SERIES_PREFIX}*/memory_in_use_bytes", f"{DEVICE_SERIES_PREFIX}memory_*",
        host_metric_name("host_cpu_percent"), host_metric_name("host_memory_used_bytes"),
        f"{PRODUCERS_SERIES_PREFIX}*utilisation", "*/cpu_cores", "*/rss_bytes",
    )
]

#: The run comparison's charts (runs/compare.html, run_compare.js): one line per run of each metric, by step.
COMPARE_CHARTS: list[dict] = [
    {"metric": REWARD_MEAN_METRIC, "title": "Reward", "caption": REWARD_MEAN_METRIC},
    {"metric": SUCCESS_RATE_METRIC, "title": "Success rate", "caption": ""},
    {"metric": LOSS_METRIC, "title": "Loss", "caption": ""},
]

RUN_CHARTS: list[dict] = [
    {
        "id": "chart-reward", "title": "Reward", "caption": f"{REWARD_MEAN_METRIC}, {SUCCESS_RATE_METRIC}",
        "empty": "No RL step yet.",
        "kind": "lines", "smooth": True,
        "series": [
            {"name": REWARD_MEAN_METRIC, "label": "reward mean", "colour": 0},
            {"name": SUCCESS_RATE_METRIC, "label": "success rate", "colour": 2},
        ],
    },
    {
        "id": "chart-evaluation", "title": "Held-out evaluation",
        "caption": "success rate and pass@k on held-out tasks, never trained on",
        "empty": "No evaluation yet: a run evaluates with an evaluation section in its config.",
        "empty_configured": ["evaluation.environment", "No evaluation yet: the first evaluates the policy before "
                             "the first RL step, then every evaluation.every_steps RL steps."],
        "kind": "lines", "smooth": False, "range": [0, 1], "source": "evaluations",
        "series": [{"name": EVALUATION_METRIC_PREFIX + EVALUATION_SUCCESS_RATE, "label": "success rate", "colour": 2}],
        "family": {"pattern": rf"^{EVALUATION_METRIC_PREFIX}pass@(?<order>\d+)$", "label": "pass@{order}", "colour": "gradient"},
    },
    {
        "id": "chart-evaluation-environments", "title": "Held-out evaluation on other environments",
        "caption": "success rate (or mean reward) on the held-out tasks of each of evaluation.environments",
        "empty": "No evaluation on another environment: name them in the config's evaluation.environments.",
        "empty_configured": ["evaluation.environments", "No evaluation on another environment yet: the first "
                             "comes before the first RL step, then every evaluation.every_steps RL steps."],
        "variants": [(EVALUATION_SUCCESS_RATE, "success rate"), (EVALUATION_MEAN_REWARD, "mean reward")],
        "kind": "lines", "smooth": False, "range_min": 0, "source": "evaluations",
        "family": {"pattern": rf"^{EVALUATION_METRIC_PREFIX}(?!{DATASET_SERIES_LABEL_PREFIX})(?<environment>[^/]+@\d+)/"
                              rf"(?<variant>{EVALUATION_SUCCESS_RATE}|{EVALUATION_MEAN_REWARD})$",
                   "label": "{environment}", "colour": "environment"},
    },
    {
        "id": "chart-evaluation-datasets", "title": "Held-out dataset loss",
        "caption": "the policy's loss (or token accuracy) on each evaluation dataset's held-out rows, never trained on",
        "empty": "No dataset evaluation yet: name datasets in the config's evaluation.datasets.",
        "empty_configured": ["evaluation.datasets", "No dataset evaluation yet: the first comes before the first "
                             "RL step, then every evaluation.every_steps RL steps."],
        "variants": [("loss", "loss"), ("token_accuracy", "token accuracy")],
        "kind": "lines", "smooth": False, "range_min": 0, "source": "evaluations",
        "family": {"pattern": rf"^{EVALUATION_METRIC_PREFIX}{DATASET_SERIES_LABEL_PREFIX}(?<environment>.+)/(?<variant>loss|token_accuracy)$",
                   "label": "{environment}", "colour": "environment"},
    },
    {
        "id": "chart-loss", "title": "Loss", "caption": "the objective the update minimised", "empty": "No step yet.",
        "kind": "lines", "smooth": True,
        "series": [{"name": LOSS_METRIC, "label": "loss", "colour": 1}],
    },
    {
        "id": "chart-kl-entropy", "title": "KL and entropy",
        "caption": "algorithm/kl (with a KL term), algorithm/entropy", "empty": "No RL step yet.",
        "kind": "lines", "smooth": True,
        "series": [
            # Only an algorithm with a KL term reports it.
            {"name": "algorithm/kl", "label": "KL", "colour": 3, "optional": True},
            {"name": "algorithm/entropy", "label": "entropy (right axis)", "colour": 5, "scale": "entropy"},
        ],
    },
    {
        "id": "chart-stages", "title": "Trainer time by stage",
        "caption": "share of each step's wall time; compute is the utilisation", "empty": "No step yet.",
        # Shares of the step's wall time: the stages sum to it.
        "kind": "stacked", "range": [0, 1], "percent": True, "share_of": "wall_s",
        "series": [
            {"name": stage_metric_name(style["name"]), "label": style["label"], "colour": style["colour"],
             "optional": True}
            for style in stage_styles()
        ],
    },
    {
        "id": "chart-samples", "title": "Samples per second",
        "caption": "produced by rollouts against consumed by the trainer", "empty": "No RL step yet.",
        "kind": "lines", "smooth": True, "range_min": 0,
        "series": [
            {"name": SAMPLES_PRODUCED_PER_S_METRIC, "label": "produced/s", "colour": 4},
            {"name": SAMPLES_PER_S_METRIC, "label": "consumed/s", "colour": 0},
        ],
    },
    {
        "id": "chart-tokens", "title": "Tokens per second",
        "caption": "trained, per wall second of the step; and the share of the batch that was padding (right axis)",
        "empty": "No step yet.",
        "kind": "lines", "smooth": True, "range_min": 0,
        "series": [{"name": TOKENS_PER_S_METRIC, "label": "tokens/s", "colour": 5},
                   {"name": PADDING_FRACTION_METRIC, "label": "padding share (right axis)", "colour": 6,
                    "scale": "share", "optional": True}],
    },
    {
        "id": "chart-staleness", "title": "Staleness", "caption": "trained trajectories by policy versions behind",
        "empty": "No RL step yet.",
        "variants": [("total", "total"), ("in_queue", "in queue"), ("in_flight", "in flight")],
        "kind": "stacked",
        # Fresh data green, staler data towards red.
        "family": {"pattern": r"^staleness/(?<variant>total|in_queue|in_flight)/(?<order>\d+\+?)$",
                   "label": "{order} versions", "label_one": "{order} version", "colour": "gradient"},
    },
    {
        "id": "chart-latency", "title": "Rollout latency",
        "caption": "seconds per episode, p50 / p90 (dashed) / p99 (dotted)", "empty": "No rollout yet.",
        # slot wait: before the episode starts, waiting for its environment's max_concurrent_episodes.
        "variants": [("latency", "episode"), ("generation", "generation"), ("environment", "environment"),
                     ("slot_wait", "slot wait")],
        "kind": "lines", "smooth": True, "range_min": 0,
        "family": {
            "pattern": r"^rollout/(?<environment>.+)/(?<variant>latency|generation|environment|slot_wait)"
                       r"_p(?<order>50|90|99)_s$",
            "label": "{environment} p{order}", "colour": "environment", "dash": {"90": [6, 4], "99": [2, 3]},
        },
    },
    {
        "id": "chart-errors", "title": "Failed and truncated episodes",
        "caption": "share of episodes per environment: failed, or cut off by max_turns or max_seq_len",
        "empty": "No rollout yet.",
        "variants": [("error", "failed"), ("truncated", "truncated")],
        "kind": "lines", "smooth": True, "range_min": 0, "min_span": 0.1,
        "family": {"pattern": r"^rollout/(?<environment>.+)/(?<variant>error|truncated)_rate$",
                   "label": "{environment}", "colour": "environment"},
    },
    {
        "id": "chart-tools", "title": "Tool use",
        "caption": "per environment that offers tools: the share of episodes with a call that ran, calls per "
                   "episode, answers given without any call, and of the turns that wrote call markup, those "
                   "that did not parse, named an unknown tool, failed the tool's schema or were refused by it, and of the "
                   "calls that ran, those that copied their tool's example",
        "empty": "No rollout of an environment with tools yet.",
        "variants": [("tool_call_rate", "calling a tool"), ("tool_calls_per_episode", "calls per episode"),
                     ("answered_no_tools_rate", "answered without a call"),
                     ("tool_parse_failure_rate", "did not parse"), ("unknown_tool_rate", "unknown tool"),
                     ("invalid_arguments_rate", "invalid arguments"), ("tool_error_rate", "tool refused"),
                     ("example_copy_rate", "copied the example")],
        "kind": "lines", "smooth": True, "range_min": 0, "min_span": 0.1,
        "family": {
            "pattern": r"^rollout/(?<environment>.+)/(?<variant>tool_call_rate|tool_calls_per_episode|"
                       r"answered_no_tools_rate|tool_parse_failure_rate|unknown_tool_rate|invalid_arguments_rate|"
                       r"tool_error_rate|example_copy_rate)$",
            "label": "{environment}", "colour": "environment",
        },
    },
    {
        "id": "chart-idle", "title": "What the trainer waited on",
        "caption": "share of each step spent waiting for data, by environment and cause (from the episode that "
                   "ended each wait); the run page's sentence sums the last 50 steps",
        "empty": "No RL step yet.",
        "kind": "stacked", "share_of": "wall_s", "percent": True,
        "family": {"pattern": rf"^idle/(?<environment>.+/({'|'.join(IDLE_CAUSES)}))_s$",
                   "label": "{environment}", "colour": "environment"},
    },
    {
        "id": "chart-policy", "title": "Policy version", "caption": "newest published", "empty": "No step yet.",
        "kind": "lines", "smooth": False, "range_min": 0, "min_span": 1,
        "series": [{"name": POLICY_VERSION_METRIC, "label": "policy version", "colour": 0}],
    },
    *SYSTEM_CHARTS,
]


def run_charts(config: dict) -> list[dict]:
    """:data:`RUN_CHARTS` for a run of ``config`` (its normalised JSON): each chart's ``empty`` is its
    ``empty_configured`` text where the config sets that chart's path to something other than null,
    false or empty."""
    return [{**chart, "empty": chart["empty_configured"][1]} if _config_sets(config, chart.get("empty_configured"))
            else chart for chart in RUN_CHARTS]


def _config_sets(config: dict, configured: list | None) -> bool:
    if configured is None:
        return False
    value: object = config
    for key in configured[0].split("."):
        if not isinstance(value, dict):
            return False
        value = value.get(key)
    return bool(value)
