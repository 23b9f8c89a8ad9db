"""The new-run form, generated from RunConfig's published JSON schema.

``config_form`` turns the schema into a tree: ``ConfigSection`` for each nested
model (an optional one, like ``evaluation`` or ``algorithm.kl``, has an on/off
toggle), ``ConfigField`` for each leaf. A leaf is a number, checkbox, select or
text input, a comma- or line-separated list of scalars, repeatable rows of a
list of objects (``sft.datasets``), or, for what stays free-form (a dict such
as ``model.rope_scaling``), a JSON box with a hint of its keys. The basic
fields are gathered into one open section; the config's sections follow,
collapsed.

Inputs are named ``config.<dotted path>`` (a row's cells
``config.sft.datasets.<i>.<name>``), as ``InvalidInput.from_pydantic`` names
errors, so a service's error shows next to the input of its path.
``config_from_form`` reads a submitted form back into a *partial* config: only
what differs from the defaults (and from what the algorithm's preset would
resolve), so a run stores what its author chose.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tandem.configs.run import RunConfig, resolve_schema_ref

from .config_labels import config_label

INPUT_PREFIX = "config."

# The fields shown open, in this order: what most runs set. The rest stays in collapsed sections.
BASIC_PATHS = (
    "algorithm.name", "model.hf_checkpoint", "model.tokenizer", "sft_steps", "rl_steps", "learning_rate",
    "rl_learning_rate", "sft.datasets", "evaluation",
)
# The config's sections in the order the form folds them: the ones most often opened first.
ADVANCED_ORDER = ("algorithm", "model", "sampling", "rollout", "sft", "optimizer", "schedule", "memory", "lora", "mesh",
                  "stream", "checkpoint", "weights")
# Lists of strings that may hold commas: one item per line. Other lists of scalars take commas.
LINE_SEPARATED = frozenset({"sampling.stop_strings"})
# What a free-form JSON field takes, where its schema cannot say (a dict of any keys).
JSON_HINTS = {
    "model.rope_scaling": '{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, '
                          '"original_max_position_embeddings": 8192}',
    "model.chat_template_kwargs": '{"enable_thinking": false}',
}
# Where a row's index sits in a row template's names and ids; the page replaces it.
ROW_INDEX = "__index__"


@dataclass(frozen=True)
class ConfigField:
    """One input of the config: a leaf, a list of scalars, or a list of objects as rows."""

    path: str  # dotted, e.g. "algorithm.epsilon_high"; a row cell's is relative to its row ("weight")
    label: str
    help_text: str
    # number | checkbox | select | text | list | rows | json
    widget: str
    default: Any
    nullable: bool = False
    required: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    item_type: str = ""  # list: integer | number | string
    separator: str = ""  # list: "," or "\n"
    json_hint: str = ""
    cells: tuple[ConfigField, ...] = ()  # rows: the fields of one row

    @property
    def input_name(self) -> str:
        return INPUT_PREFIX + self.path

    @property
    def input_id(self) -> str:
        return input_id(self.path)

    def render_value(self, value: Any) -> str:
        """``value`` as the input shows it (None is blank: the field's "not set")."""
        if value is None:
            return ""
        if self.widget == "json":
            return json.dumps(value)
        if self.widget == "list":
            return ("\n" if self.separator == "\n" else ", ").join(str(item) for item in value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "None"
        if self.widget == "list":
            return self.render_value(self.default).replace("\n", ", ") or "empty"
        if self.widget == "rows":
            return "none" if not self.default else json.dumps(self.default)
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

    @property
    def format_text(self) -> str:
        """How a list or JSON input is written, for its help line."""
        if self.widget == "list":
            items = {"integer": "whole numbers", "number": "numbers"}.get(self.item_type, "values")
            return f"{items}, one per line" if self.separator == "\n" else f"{items}, separated by commas"
        if self.widget == "json":
            return f"JSON, e.g. {self.json_hint}" if self.json_hint else "JSON"
        return ""

    @property
    def is_section(self) -> bool:
        return False


@dataclass
class ConfigSection:
    """The fields of one object of the schema; ``optional`` ones (default null) can be turned on."""

    path: str
    title: str
    description: str
    optional: bool = False
    children: list[ConfigField | ConfigSection] = field(default_factory=list)
    html_name: str = ""  # the top level's two sections share path ""

    @property
    def html_id(self) -> str:
        return "config-section-" + (self.html_name or self.path.replace(".", "-") or "run")

    @property
    def input_name(self) -> str:
        """The on/off toggle of an optional section."""
        return INPUT_PREFIX + self.path

    @property
    def input_id(self) -> str:
        return input_id(self.path)

    @property
    def is_section(self) -> bool:
        return True

    @property
    def fields(self) -> list[ConfigField]:
        return [child for child in self.children if not child.is_section]

    def walk(self):
        """This section, its fields and its subsections, depth first."""
        yield self
        for child in self.children:
            if child.is_section:
                yield from child.walk()
            else:
                yield child


@dataclass(frozen=True)
class ConfigForm:
    """The basic section (open) and the config's sections (collapsed)."""

    basic: ConfigSection
    advanced: list[ConfigSection]

    @property
    def sections(self) -> list[ConfigSection]:
        return [self.basic, *self.advanced]

    def walk(self):
        for section in self.sections:
            yield from section.walk()

    @property
    def fields(self) -> list[ConfigField]:
        return [node for node in self.walk() if not node.is_section]

    @property
    def optional_sections(self) -> list[ConfigSection]:
        return [node for node in self.walk() if node.is_section and node.optional]

    def labels(self) -> dict[str, str]:
        """Each field's and optional section's label, by path."""
        return {node.path: node.title if node.is_section else node.label for node in self.walk() if node.path}


def input_id(path: str) -> str:
    return "id_config_" + path.replace(".", "__")


def config_form(schema: dict[str, Any] | None = None) -> ConfigForm:
    """RunConfig's schema as the form's tree: the basic fields, then each section of the config."""
    schema = schema or RunConfig.model_json_schema()
    root = _section(schema, schema, path="", title="Run", description=schema.get("description", ""),
                    optional=False, defaults=RunConfig().model_dump(mode="json"))
    basic = ConfigSection(path="", title="Basics", description="What most runs set; the sections below hold "
                          "the rest, with their defaults.", html_name="basics")
    for path in BASIC_PATHS:
        basic.children.append(_pluck(root, path))
    top_fields = ConfigSection(path="", title="Run", description="Batch size, seed, restarts and the rest of "
                               "the run's own settings.", html_name="run")
    sections = []
    for child in root.children:
        (sections if child.is_section and not child.optional else top_fields.children).append(child)
    # A section the order does not name yet (a new one of the config) comes last, never lost.
    sections.sort(key=lambda section: ADVANCED_ORDER.index(section.path) if section.path in ADVANCED_ORDER
                  else len(ADVANCED_ORDER))
    return ConfigForm(basic=basic, advanced=[top_fields, *sections])


def config_fields(schema: dict[str, Any] | None = None) -> list[ConfigField]:
    return config_form(schema).fields


def _pluck(section: ConfigSection, path: str) -> ConfigField | ConfigSection:
    """Take the node at ``path`` out of the tree under ``section``."""
    for node in section.walk():
        if node.is_section:
            for child in node.children:
                if child.path == path:
                    node.children.remove(child)
                    return child
    raise KeyError(path)


def _section(root, node, *, path, title, description, optional, defaults) -> ConfigSection:
    section = ConfigSection(path=path, title=title, description=description, optional=optional)
    required = set(node.get("required", ()))
    for name, prop in node.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        if child_path == "schema_version":
            continue  # the form always posts the current shape
        variants = prop.get("anyOf", [prop])
        nullable = any(variant.get("type") == "null" for variant in variants)
        targets = [resolve_schema_ref(root, variant) for variant in variants if variant.get("type") != "null"]
        if len(targets) == 1 and targets[0].get("type") == "object" and "properties" in targets[0]:
            child_defaults = defaults.get(name) if isinstance(defaults.get(name), dict) else {}
            section.children.append(_section(
                root, targets[0], path=child_path, title=config_label(child_path), optional=nullable,
                description=prop.get("description") or targets[0].get("description", ""), defaults=child_defaults))
            continue
        if "default" not in prop and name in defaults:
            # A default_factory (an empty list, say) is not in the schema; the model knows it.
            prop = {**prop, "default": defaults[name]}
        section.children.append(_field(root, prop, child_path, required=name in required))
    return section


def _field(root, prop, path, *, required=False, label_path=None) -> ConfigField:
    variants = prop.get("anyOf", [prop])
    nullable = any(variant.get("type") == "null" for variant in variants)
    others = [resolve_schema_ref(root, variant) for variant in variants if variant.get("type") != "null"]
    default = prop.get("default")
    if default is None and not nullable and others and others[0].get("type") == "array" and not required:
        default = []
    common = {
        "path": path,
        "label": config_label(label_path or path),
        "help_text": prop.get("description", ""),
        "default": default,
        "nullable": nullable,
        "required": required,
    }
    choices = [value for other in others for value in other.get("enum", [other.get("const")] if "const" in other else [])]
    if others and all("enum" in other or "const" in other for other in others):
        # tool_call_format: one of the formats, or "auto".
        return ConfigField(widget="select", choices=tuple(choices), **common)
    if len(others) == 1:
        kind = others[0]
        if kind.get("type") == "boolean":
            return ConfigField(widget="checkbox", **common)
        if kind.get("type") in ("integer", "number"):
            return ConfigField(widget="number", integer=kind["type"] == "integer", **_bounds(kind), **common)
        if kind.get("type") == "string":
            return ConfigField(widget="text", **common)
        if kind.get("type") == "array":
            items = resolve_schema_ref(root, kind.get("items", {}))
            if items.get("type") == "object" and "properties" in items:
                cell_required = set(items.get("required", ()))
                cells = tuple(
                    _field(root, cell, name, required=name in cell_required, label_path=name)
                    for name, cell in items["properties"].items()
                )
                return ConfigField(widget="rows", cells=cells, **common)
            if items.get("type") in ("integer", "number", "string"):
                separator = "\n" if path in LINE_SEPARATED else ","
                return ConfigField(widget="list", item_type=items["type"], separator=separator, **common)
    return ConfigField(widget="json", json_hint=JSON_HINTS.get(path, ""), **common)


def _bounds(kind) -> dict[str, Any]:
    return {
        "minimum": kind.get("minimum"), "maximum": kind.get("maximum"),
        "exclusive_minimum": kind.get("exclusiveMinimum"), "exclusive_maximum": kind.get("exclusiveMaximum"),
    }


# --- What a form shows: raw input texts, from a config or from a submitted form. ---


@dataclass
class FormState:
    """What every input of the form holds: leaves' texts, optional sections' toggles, rows' cells."""

    texts: dict[str, str] = field(default_factory=dict)
    sections_on: dict[str, bool] = field(default_factory=dict)
    rows: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def form_state(form: ConfigForm, config: dict[str, Any] | None = None) -> FormState:
    """The inputs showing ``config`` (a stored full or partial config; None: the defaults)."""
    config = config or {}
    state = FormState()
    for node in form.walk():
        if not node.path:
            continue
        present, value = config_value_at(config, node.path)
        if node.is_section:
            if node.optional:
                state.sections_on[node.path] = present and isinstance(value, dict)
            continue
        if not present:
            value = node.default
        if node.widget == "rows":
            state.rows[node.path] = [
                {cell.path: cell.render_value(item.get(cell.path, cell.default)) for cell in node.cells}
                for item in value or [] if isinstance(item, dict)
            ]
        elif node.widget == "checkbox":
            state.texts[node.path] = "true" if value else "false"
        else:
            state.texts[node.path] = node.render_value(value)
    return state


def config_value_at(config: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(whether ``config`` has dotted ``path``, its value there)."""
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


@dataclass
class ConfigFormData:
    """A submitted form: what to show again, the partial config, and the inputs that did not parse."""

    state: FormState
    changes: dict[str, Any]
    errors: dict[str, list[str]]

    def row_paths(self) -> list[str]:
        """The dotted paths of every submitted row's cells, where errors about them show."""
        return [f"{path}.{index}.{cell}" for path, rows in self.state.rows.items()
                for index, row in enumerate(rows) for cell in row]


def config_from_form(data, form: ConfigForm) -> ConfigFormData:
    """Read the ``config.<path>`` inputs of ``data`` (a QueryDict); keep only what differs from defaults.

    Every input that does not even parse (bad JSON, a list item that is not a
    number) is an error here, all at once; a number that does not parse is passed
    on as text, so RunConfig's own validation names it with every other error.
    The fields of an optional section that is off are shown again but not read.
    """
    state = FormState()
    errors: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    off: list[str] = []
    for node in form.walk():
        if not node.path:
            continue
        if node.is_section:
            if node.optional:
                state.sections_on[node.path] = node.input_name in data
                if node.input_name not in data:
                    off.append(node.path)
            continue
        if any(node.path.startswith(section + ".") for section in off):
            _read_raw(node, data, state)
            continue
        read, value = _read(node, data, state, errors)
        if read:
            values[node.path] = value
            if value != node.default:
                _set_path(changes, node.path, value)
    for section in form.optional_sections:
        if state.sections_on[section.path] and not any(section.path.startswith(other + ".") for other in off):
            _set_path(changes, section.path, _get_path(changes, section.path) or {})
    # A value left at the schema's default may still differ from what the config resolves to
    # (algorithm.name=dapo presets epsilon_high=0.28): the form's value is what was asked for.
    resolved = _resolved(changes)
    if resolved is not None:
        for path in off:
            if _get_path(resolved, path) is not None:
                _set_path(changes, path, None)
        for path, value in values.items():
            if value != _get_path(resolved, path):
                _set_path(changes, path, value)
    return ConfigFormData(state=state, changes=changes, errors=errors)


def _read_raw(node: ConfigField, data, state: FormState) -> None:
    if node.widget == "rows":
        state.rows[node.path] = _submitted_rows(node, data)
    elif node.widget == "checkbox":
        state.texts[node.path] = "true" if node.input_name in data else "false"
    else:
        state.texts[node.path] = data.get(node.input_name, "")


def _read(node: ConfigField, data, state: FormState, errors) -> tuple[bool, Any]:
    """(whether the input gives a value, the value); a blank input gives its default."""
    _read_raw(node, data, state)
    if node.widget == "checkbox":
        return True, node.input_name in data
    if node.widget == "rows":
        rows = []
        for index, row in enumerate(state.rows[node.path]):
            if not any(text.strip() for text in row.values()):
                continue  # an empty row added and left: nothing
            item = {}
            for cell in node.cells:
                read, value = _parse(cell, row.get(cell.path, ""), f"{node.path}.{index}.{cell.path}", errors)
                if read:
                    item[cell.path] = value
            rows.append(item)
        return True, rows
    return _parse(node, state.texts[node.path], node.path, errors)


def _parse(node: ConfigField, raw: str, path: str, errors) -> tuple[bool, Any]:
    text = raw.strip()
    if not text:
        if node.widget == "list":
            return True, []
        return (True, None) if node.nullable else (False, None)
    if node.widget == "json":
        try:
            return True, json.loads(text)
        except json.JSONDecodeError as error:
            errors.setdefault(path, []).append(f"Not valid JSON: {error.msg} (line {error.lineno}, column {error.colno}).")
            return False, None
    if node.widget == "number":
        return True, _parse_number(text, integer=node.integer)
    if node.widget == "list":
        lines = raw.splitlines() if node.separator == "\n" else raw.split(",")
        items = [item if node.item_type == "string" and node.separator == "\n" else item.strip()
                 for item in lines if item.strip()]
        if node.item_type in ("integer", "number"):
            parsed = [_parse_number(item, integer=node.item_type == "integer") for item in items]
            bad = [item for item in parsed if isinstance(item, str)]
            if bad:
                kind = "a whole number" if node.item_type == "integer" else "a number"
                errors.setdefault(path, []).append(f"{', '.join(bad)}: not {kind}.")
                return False, None
            items = parsed
        return True, items
    return True, text


def _submitted_rows(node: ConfigField, data) -> list[dict[str, str]]:
    """The rows posted for ``node``, in the order of their indices (the page numbers them 0, 1, ...)."""
    pattern = re.compile(rf"^{re.escape(node.input_name)}\.(\d+)\.(\w+)$")
    rows: dict[int, dict[str, str]] = {}
    for name in data:
        match = pattern.match(name)
        if match:
            rows.setdefault(int(match.group(1)), {})[match.group(2)] = data.get(name, "")
    cells = [cell.path for cell in node.cells]
    return [{cell: rows[index].get(cell, "") for cell in cells} for index in sorted(rows)]


def _resolved(changes: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return RunConfig.model_validate(changes).model_dump(mode="json")
    except ValidationError:
        return None  # the service reports it, field by field


def _get_path(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(config.get(part), dict):
            config[part] = {}
        config = config[part]
    config[leaf] = value


def _parse_number(text: str, *, integer: bool) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    if integer and number.is_integer() and "." not in text and "e" not in text.lower():
        return int(text)
    return text if integer else number


def _number_text(number: float) -> str:
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else str(number)
