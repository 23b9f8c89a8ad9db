"""The new-run form, generated from RunConfig's published JSON schema.

``config_sections`` turns the schema into sections of ``ConfigField`` (one per
leaf field, named by its dotted path, as ``InvalidInput.from_pydantic`` names
errors), which a template renders; ``config_from_form`` reads a submitted form
back into a *partial* config: only the fields whose value differs from the
schema's default, so a run stores what its author chose, and RunConfig's
defaults (and the algorithm's presets) fill the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tandem.algorithm_config import AlgorithmConfig
from tandem.run_config import RunConfig, resolve_schema_ref

# The form's inputs are named ``config.<dotted path>``, like the service's errors.
INPUT_PREFIX = "config."


@dataclass(frozen=True)
class ConfigField:
    """One leaf of the config, as a form input."""

    path: str  # dotted, e.g. "algorithm.epsilon_high"
    label: str
    help_text: str
    # number | checkbox | select | text | json (lists, dicts, optional sections: edited as JSON)
    widget: str
    default: Any
    nullable: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None

    @property
    def input_name(self) -> str:
        return INPUT_PREFIX + self.path

    @property
    def input_id(self) -> str:
        return "id_config_" + self.path.replace(".", "__")

    def render_value(self, value: Any) -> str:
        """``value`` as the input shows it (None is blank: the field's "not set")."""
        if value is None:
            return ""
        if self.widget == "json":
            return json.dumps(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "None"
        return json.dumps(self.default) if self.widget == "json" else self.render_value(self.default)

    @property
    def bounds_text(self) -> str:
        """The allowed range in words, e.g. "> 0, ≤ 1"."""
        parts = []
        if self.minimum is not None:
            parts.append(f"≥ {_number_text(self.minimum)}")
        if self.exclusive_minimum is not None:
            parts.append(f"> {_number_text(self.exclusive_minimum)}")
        if self.maximum is not None:
            parts.append(f"≤ {_number_text(self.maximum)}")
        if self.exclusive_maximum is not None:
            parts.append(f"< {_number_text(self.exclusive_maximum)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ConfigSection:
    """The fields of one object of the schema: the top level (path "") or a nested model."""

    path: str
    title: str
    description: str
    fields: list[ConfigField] = field(default_factory=list)

    @property
    def html_id(self) -> str:
        return "config-section-" + (self.path.replace(".", "-") or "run")


def config_sections(schema: dict[str, Any] | None = None) -> list[ConfigSection]:
    """RunConfig's schema as form sections: the top level first, then each nested model."""
    schema = schema or RunConfig.model_json_schema()
    sections: list[ConfigSection] = []
    _add_section(schema, schema, path="", title="Run", description=schema.get("description", ""),
                 sections=sections, defaults=RunConfig().model_dump(mode="json"))
    return sections


def config_fields(schema: dict[str, Any] | None = None) -> list[ConfigField]:
    return [config_field for section in config_sections(schema) for config_field in section.fields]


def config_defaults(fields: list[ConfigField]) -> dict[str, Any]:
    return {config_field.path: config_field.default for config_field in fields}


def config_flatten(config: dict[str, Any], fields: list[ConfigField]) -> dict[str, Any]:
    """A (stored, full or partial) config's value for each field path it has."""
    values = {}
    for config_field in fields:
        node: Any = config
        for part in config_field.path.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            values[config_field.path] = node
    return values


@dataclass
class ConfigFormData:
    """A submitted form: what to show again (raw strings), the partial config, and input errors."""

    raw: dict[str, str]
    changes: dict[str, Any]
    errors: dict[str, list[str]]


def config_from_form(data, fields: list[ConfigField]) -> ConfigFormData:
    """Read ``config.<path>`` inputs of ``data`` (a QueryDict); keep only what differs from defaults.

    A value that does not even parse (bad JSON) is an error here; a number that
    does not parse is passed on as text, so RunConfig's own validation names it
    with every other error at once.
    """
    raw: dict[str, str] = {}
    changes: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    for config_field in fields:
        name = config_field.input_name
        if config_field.widget == "checkbox":
            value: Any = name in data
            raw[config_field.path] = "true" if value else "false"
        else:
            text = data.get(name, "").strip()
            raw[config_field.path] = text
            if not text:
                if not config_field.nullable:
                    continue  # left blank: the default
                value = None
            elif config_field.widget == "json":
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as error:
                    errors.setdefault(config_field.path, []).append(f"Not valid JSON: {error.msg}.")
                    continue
            elif config_field.widget == "number":
                value = _parse_number(text, integer=config_field.integer)
            else:
                value = text
        values[config_field.path] = value
        if value != config_field.default:
            _set_path(changes, config_field.path, value)
    # A value left at the schema's default may still differ from what the config resolves to
    # (algorithm.name=dapo presets epsilon_high=0.28): the form's value is what was asked for.
    resolved = _resolved(changes)
    if resolved is not None:
        for path, value in values.items():
            if value != _get_path(resolved, path):
                _set_path(changes, path, value)
    return ConfigFormData(raw=raw, changes=changes, errors=errors)


def algorithm_presets() -> dict[str, dict[str, Any]]:
    """Each algorithm's resolved section, by name, so the form can show what picking it sets."""
    names = AlgorithmConfig.model_json_schema()["properties"]["name"]["enum"]
    return {name: AlgorithmConfig(name=name).model_dump(mode="json") for name in names}


def _resolved(changes: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return RunConfig.model_validate(changes).model_dump(mode="json")
    except ValidationError:
        return None  # the service reports it, field by field


def _get_path(config: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _add_section(root, node, *, path, title, description, sections, defaults):
    section = ConfigSection(path=path, title=title, description=description)
    sections.append(section)
    nested = []
    for name, prop in node.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        if child_path == "schema_version":
            continue  # the form always posts the current shape
        target = resolve_schema_ref(root, prop)
        if target.get("type") == "object" and "properties" in target:
            # A required nested model (model, algorithm, ...): a fieldset of its own.
            title = target.get("title", name).removesuffix("Config") or name
            nested.append((target, child_path, title, prop.get("description", ""), defaults.get(name) or {}))
            continue
        if "default" not in prop and name in defaults:
            # A default_factory (an empty list, say) is not in the schema; the model knows it.
            prop = {**prop, "default": defaults[name]}
        section.fields.append(_field(root, prop, child_path, name))
    for target, child_path, child_title, child_description, child_defaults in nested:
        _add_section(root, target, path=child_path, title=child_title,
                     description=child_description or target.get("description", ""), sections=sections,
                     defaults=child_defaults)


def _field(root, prop, path, name) -> ConfigField:
    variants = prop.get("anyOf", [prop])
    nullable = any(variant.get("type") == "null" for variant in variants)
    others = [resolve_schema_ref(root, variant) for variant in variants if variant.get("type") != "null"]
    common = {
        "path": path,
        # An optional section's property has no title in the schema (it is a $ref).
        "label": prop.get("title") or (name.upper() if len(name) <= 2 else name.replace("_", " ").capitalize()),
        "help_text": prop.get("description", ""),
        "default": prop.get("default"),
        "nullable": nullable,
    }
    if len(others) == 1:
        kind = others[0]
        if "enum" in kind:
            return ConfigField(widget="select", choices=tuple(kind["enum"]), **common)
        if kind.get("type") == "boolean":
            return ConfigField(widget="checkbox", **common)
        if kind.get("type") in ("integer", "number"):
            return ConfigField(
                widget="number",
                integer=kind["type"] == "integer",
                minimum=kind.get("minimum"),
                maximum=kind.get("maximum"),
                exclusive_minimum=kind.get("exclusiveMinimum"),
                exclusive_maximum=kind.get("exclusiveMaximum"),
                **common,
            )
        if kind.get("type") == "string":
            return ConfigField(widget="text", **common)
    return ConfigField(widget="json", **common)


def _parse_number(text: str, *, integer: bool) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    if integer and number.is_integer() and "." not in text and "e" not in text.lower():
        return int(text)
    return text if integer else number


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        config = config.setdefault(part, {})
    config[leaf] = value


def _number_text(number: float) -> str:
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else str(number)
