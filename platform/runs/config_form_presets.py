"""What the new-run form offers besides its fields: presets, and the review of a config before it starts.

A preset is a partial config shown as the inputs it sets: each algorithm's
resolved section (picking dapo turns on overlong shaping and dynamic
sampling), "fast demo" (the few steps and small batches of ``tandem up
--demo``) and "real model" (SmolLM2-135M-Instruct as the demo configures it,
offered only where ``make models`` imported it under the operator's model
roots). The page fills the inputs and says what changed; nothing is sent until
the user starts the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.configs.algorithm import AlgorithmConfig
from tandem.configs.demo_runs import SHORT_RUN_CONFIG, SMOLLM2_DIR, smollm2_config
from tandem.configs.run import RunConfig

from .config_form import ConfigForm, config_value_at

ALGORITHM_LABELS = {"sft": "SFT only", "grpo": "GRPO", "dr_grpo": "Dr. GRPO", "dapo": "DAPO", "rloo": "RLOO",
                    "ppo": "PPO"}


@dataclass(frozen=True)
class FormPreset:
    key: str
    label: str
    description: str
    inputs: dict[str, str | bool]  # input name -> text, or a checkbox's (or section toggle's) state


def algorithm_presets() -> dict[str, dict[str, Any]]:
    """Each algorithm's resolved section, by name: what picking it sets."""
    names = AlgorithmConfig.model_json_schema()["properties"]["name"]["enum"]
    return {name: AlgorithmConfig(name=name).model_dump(mode="json") for name in names}


def form_presets(form: ConfigForm, *, model_roots: Iterable[Path]) -> list[FormPreset]:
    """The presets the page offers: each algorithm's, "fast demo", and "real model" where it is installed."""
    presets = [
        FormPreset(key=f"algorithm-{name}", label=ALGORITHM_LABELS.get(name, name),
                   description=f"the {ALGORITHM_LABELS.get(name, name)} algorithm with its defaults",
                   inputs=preset_inputs(form, {"algorithm": section}))
        for name, section in algorithm_presets().items()
    ]
    presets.append(FormPreset(
        key="fast-demo", label="Fast demo",
        description="a few steps of small batches, as `tandem up --demo` runs: done in minutes",
        inputs=preset_inputs(form, SHORT_RUN_CONFIG)))
    model = installed_demo_model(model_roots)
    if model is not None:
        presets.append(FormPreset(
            key="real-model", label="Real model (SmolLM2-135M-Instruct)",
            description=f"SmolLM2-135M-Instruct from {model}, as `tandem up --demo --model smollm2` runs it "
            "(made for the calculator-chat environment)",
            inputs=preset_inputs(form, smollm2_config(model))))
    return presets


def installed_demo_model(model_roots: Iterable[Path]) -> Path | None:
    """SmolLM2-135M-Instruct's directory under one of the model roots, where ``make models`` put it."""
    for root in model_roots:
        directory = Path(root) / SMOLLM2_DIR.name
        if (directory / "config.json").is_file():
            return directory.resolve()
    return None


def model_directories(model_roots: Iterable[Path]) -> list[Path]:
    """The model directories (a config.json in them) under the model roots: what model.hf_checkpoint may name."""
    found = []
    for root in model_roots:
        if Path(root).is_dir():
            found.extend(sorted(path for path in Path(root).iterdir() if (path / "config.json").is_file()))
    return found


def preset_inputs(form: ConfigForm, config: dict[str, Any]) -> dict[str, str | bool]:
    """The inputs a partial ``config`` sets, and how: only the paths it has."""
    inputs: dict[str, str | bool] = {}
    for node in form.walk():
        present, value = config_value_at(config, node.path) if node.path else (False, None)
        if not present:
            continue
        if node.is_section:
            if node.optional:
                inputs[node.input_name] = isinstance(value, dict)
        elif node.widget == "checkbox":
            inputs[node.input_name] = bool(value)
        elif node.widget != "rows":
            inputs[node.input_name] = node.render_value(value)
    return inputs


def config_review(form: ConfigForm, config: dict[str, Any]) -> list[dict[str, str]]:
    """What ``config`` (validated, every default filled) changes from the defaults, field by field.

    An optional section turned on or off is one line; within it, only the fields
    that differ from that section's own defaults. Labels and paths name each line.
    """
    defaults = RunConfig().model_dump(mode="json")
    lines = []
    for node in form.walk():
        if not node.path:
            continue
        present, value = config_value_at(config, node.path)
        default_present, default = config_value_at(defaults, node.path)
        if node.is_section:
            if node.optional and isinstance(value, dict) != isinstance(default, dict):
                lines.append(_line(node.path, node.title, "off" if default is None else "on",
                                   "on" if isinstance(value, dict) else "off"))
            continue
        if not present:
            continue  # in a section that is off
        if not default_present:
            default = node.default  # in a section that is off by default: its own defaults
        if value != default:
            lines.append(_line(node.path, node.label, _text(default), _text(value)))
    return lines


def _line(path: str, label: str, default: str, value: str) -> dict[str, str]:
    return {"path": path, "label": label, "default": default, "value": value}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
