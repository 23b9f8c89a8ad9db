"""What a workspace shows, as its URL's query says it: the one shape of a saved view and of the panels a
report embeds. ``frontend/static/tandem/workspace.js`` reads and writes the same keys:

- ``q``: a piece of a run's name or of one of its tags; ``status``: one run status;
- ``m``: the metrics drawn, a panel each (comma-separated, at most MAX_METRICS);
- ``g``: what colours and groups the runs: ``tag``, or ``config.<path>`` (a key of the run config);
- ``x``: ``step`` (trainer step) or ``rl_step``; ``s``: the smoothing weight, 0 to 0.99;
- ``z``: the x range zoomed to, ``<from>,<to>``; ``log``: the metrics drawn on a log scale;
- ``y.<metric>``: a panel's y range, ``<min>,<max>`` (either side may be empty);
- ``c``: the table's extra columns, ``config.<path>`` or ``metric.<name>`` (a summary: the newest value);
- ``o``: the column the table sorts by, descending with a leading ``-``;
- ``f.<column>``: a column's filter: ``>0.5``, ``<=3``, ``=grpo``, or a piece of the text;
- ``view``: the saved view it was opened from (a label only).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from common.db_limits import require_no_nul
from common.domain_errors import InvalidInput
from tandem.contracts import RunStatus

MAX_METRICS = 8
MAX_COLUMNS = 20
MAX_TEXT = 200
X_AXES = ("step", "rl_step")
#: Columns every run has (runs.models.Run), besides config.* and metric.* ones.
BUILTIN_COLUMNS = ("name", "status", "tags", "group", "duration", "step", "created")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_./:\-]{1,64}$")
_CONFIG_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
_FILTER = re.compile(r"^(>=|<=|>|<|=)?(.*)$", re.DOTALL)


def _metric(name: str, *, field_name: str) -> str:
    if not _METRIC_NAME.match(name):
        raise InvalidInput.for_field(field_name, f"'{name[:80]}' is not a metric name (letters, digits, _ . / : -).")
    return name


def _column(key: str, *, field_name: str) -> str:
    if key in BUILTIN_COLUMNS:
        return key
    kind, _, rest = key.partition(".")
    if kind == "config" and _CONFIG_PATH.match(rest):
        return key
    if kind == "metric" and _METRIC_NAME.match(rest):
        return key
    raise InvalidInput.for_field(field_name, (
        f"'{key[:80]}' is no column: one of {', '.join(BUILTIN_COLUMNS)}, config.<path> or metric.<name>."))


def _number(text: str, *, field_name: str) -> float | None:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput.for_field(field_name, f"'{text[:40]}' is not a number.") from None
    if not math.isfinite(value):
        raise InvalidInput.for_field(field_name, "must be a finite number.")
    return value


def _pair(text: str, *, field_name: str) -> tuple[float | None, float | None]:
    low, comma, high = text.partition(",")
    if not comma:
        raise InvalidInput.for_field(field_name, "must be '<min>,<max>' (either side may be empty).")
    pair = (_number(low, field_name=field_name), _number(high, field_name=field_name))
    if None not in pair and pair[0] >= pair[1]:
        raise InvalidInput.for_field(field_name, "its first bound must be below its second.")
    return pair


def _names(text: str, *, field_name: str, most: int, check) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if len(names) > most:
        raise InvalidInput.for_field(field_name, f"at most {most}, not {len(names)}.")
    return tuple(check(name, field_name=field_name) for name in names)


@dataclass(frozen=True)
class WorkspaceView:
    search: str = ""
    status: str = ""
    metrics: tuple[str, ...] = ("reward_mean",)
    group_by: str = ""
    x_axis: str = "step"
    smoothing: float = 0.6
    zoom: tuple[float | None, float | None] | None = None
    log_metrics: tuple[str, ...] = ()
    y_ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    sort: str = ""
    filters: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, query: str) -> WorkspaceView:
        """The view a query string names; an unknown key or a bad value is an InvalidInput naming it."""
        values: dict = {}
        y_ranges: dict = {}
        filters: dict = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            require_no_nul(key, "query")
            require_no_nul(value, key)  # PostgreSQL's text holds none: a search for one would fail there
            if len(value) > MAX_TEXT * 4:
                raise InvalidInput.for_field(key, f"at most {MAX_TEXT * 4} characters.")
            if key == "q":
                values["search"] = value[:MAX_TEXT]
            elif key == "status":
                if value and value not in {status.value for status in RunStatus}:
                    raise InvalidInput.for_field(key, f"'{value[:40]}' is no run status.")
                values["status"] = value
            elif key == "m":
                values["metrics"] = _names(value, field_name=key, most=MAX_METRICS, check=_metric)
            elif key == "g":
                if value and value != "tag" and not (value.startswith("config.")
                                                     and _CONFIG_PATH.match(value.removeprefix("config."))):
                    raise InvalidInput.for_field(key, "groups by 'tag' or 'config.<path>'.")
                values["group_by"] = value
            elif key == "x":
                if value not in X_AXES:
                    raise InvalidInput.for_field(key, f"one of {', '.join(X_AXES)}.")
                values["x_axis"] = value
            elif key == "s":
                smoothing = _number(value, field_name=key)
                if smoothing is None or not 0 <= smoothing <= 0.99:
                    raise InvalidInput.for_field(key, "a smoothing weight from 0 to 0.99.")
                values["smoothing"] = smoothing
            elif key == "z":
                values["zoom"] = _pair(value, field_name=key) if value else None
            elif key == "log":
                values["log_metrics"] = _names(value, field_name=key, most=MAX_METRICS, check=_metric)
            elif key.startswith("y."):
                y_ranges[_metric(key[2:], field_name=key)] = _pair(value, field_name=key)
            elif key == "c":
                values["columns"] = _names(value, field_name=key, most=MAX_COLUMNS, check=_column)
            elif key == "o":
                if value:
                    _column(value.removeprefix("-"), field_name=key)
                values["sort"] = value
            elif key.startswith("f."):
                _column(key[2:], field_name=key)
                if len(value) > MAX_TEXT:
                    raise InvalidInput.for_field(key, f"at most {MAX_TEXT} characters.")
                if value:
                    filters[key[2:]] = value
            elif key != "view":
                raise InvalidInput.for_field(key, "is no key of a workspace view.")
        return cls(**values, y_ranges=y_ranges, filters=filters)

    def query(self) -> str:
        """The canonical query string: only what differs from the defaults, in a fixed order."""
        defaults = WorkspaceView()
        pairs: list[tuple[str, str]] = []
        if self.search:
            pairs.append(("q", self.search))
        if self.status:
            pairs.append(("status", self.status))
        if self.metrics != defaults.metrics:
            pairs.append(("m", ",".join(self.metrics)))
        if self.group_by:
            pairs.append(("g", self.group_by))
        if self.x_axis != defaults.x_axis:
            pairs.append(("x", self.x_axis))
        if self.smoothing != defaults.smoothing:
            pairs.append(("s", f"{self.smoothing:g}"))
        if self.zoom:
            pairs.append(("z", _pair_text(self.zoom)))
        if self.log_metrics:
            pairs.append(("log", ",".join(self.log_metrics)))
        pairs += [(f"y.{name}", _pair_text(bounds)) for name, bounds in sorted(self.y_ranges.items())]
        if self.columns:
            pairs.append(("c", ",".join(self.columns)))
        if self.sort:
            pairs.append(("o", self.sort))
        pairs += [(f"f.{column}", text) for column, text in sorted(self.filters.items())]
        return urlencode(pairs, safe=",:/")

    def config_paths(self) -> list[str]:
        """The config keys the table and the grouping read."""
        keys = [*self.columns, self.group_by, *self.filters, self.sort.removeprefix("-")]
        return list(dict.fromkeys(key.removeprefix("config.") for key in keys if key.startswith("config.")))

    def summary_metrics(self) -> list[str]:
        """The metrics whose newest value the table shows or filters or sorts by."""
        keys = [*self.columns, *self.filters, self.sort.removeprefix("-")]
        return list(dict.fromkeys(key.removeprefix("metric.") for key in keys if key.startswith("metric.")))


def _pair_text(pair: tuple[float | None, float | None]) -> str:
    return ",".join("" if bound is None else f"{bound:g}" for bound in pair)


def filter_matches(expression: str, value) -> bool:
    """Whether a column's ``value`` passes its filter (the platform judges, the page only asks):
    ``>``, ``>=``, ``<``, ``<=`` compare numbers, ``=`` is equality of the text, else a piece of it."""
    operator, operand = _FILTER.match(expression).groups()
    if operator in (">", ">=", "<", "<="):
        try:
            number, bound = float(value), float(operand)
        except (TypeError, ValueError):
            return False
        return {">": number > bound, ">=": number >= bound, "<": number < bound, "<=": number <= bound}[operator]
    text = "" if value is None else (", ".join(map(str, value)) if isinstance(value, list) else str(value))
    if operator == "=":
        return text.lower() == operand.lower()
    return operand.lower() in text.lower()
