"""docker-compose.yml is a Compose file that Docker Compose accepts.

test_deploy_config.py checks what the file says; this checks that Compose can read it at all.
Everywhere, the document is checked the way Compose checks it before doing anything else
(compose-go's loader): YAML parsed, variables interpolated, then validated against the Compose
Specification's JSON schema, vendored from compose-go, the copy `docker compose` embeds
(tests/platform/data/README.md names its source, commit and licence). Where a `docker compose`
answers, it is asked as well: `docker compose config --quiet`. Both run in one check, so a
machine without Docker still checks the file and nothing is skipped.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
SCHEMA_FILE = Path(__file__).resolve().parent / "data" / "compose-spec.json"

# `${NAME:?message}` or `${NAME?message}`: a variable Compose refuses to run without.
_REQUIRED_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?")
# One `$` expression of Compose's interpolation syntax (the specification's 12-interpolation.md):
# `$$` (a literal `$`), `${...}` without nesting, `$NAME`, or the start of a nested `${`, which
# this check refuses rather than misreads. A `$` followed by anything else stays as written.
_EXPRESSION = re.compile(r"""\$(?:(?P<escaped>\$)
                               |\{(?P<braced>[^{}$]*)\}
                               |(?P<named>[A-Za-z_][A-Za-z0-9_]*)
                               |(?P<nested>\{))""", re.VERBOSE)
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<operator>:?[-?+])(?P<argument>.*))?", re.DOTALL)


class InterpolationError(ValueError):
    """A value Compose could not interpolate: a required variable unset, or an invalid expression."""


def required_variables(text: str) -> set[str]:
    return set(_REQUIRED_VARIABLE.findall(text))


def dummy_environment(names: set[str]) -> dict[str, str]:
    """A stand-in value for each variable: URL-safe (passwords go into redis:// URLs), 16+ characters."""
    return {name: f"dummy-{name.lower().replace('_', '-')}-0123456789abcdef" for name in names}


def _dotted(path: tuple[Any, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".") or "(top level)"


def _interpolate_string(value: str, environment: Mapping[str, str], path: tuple[Any, ...]) -> str:
    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["nested"]:
            raise InterpolationError(f"{_dotted(path)}: nested interpolation, which this check does not read")
        if match["named"]:
            return environment.get(match["named"], "")
        braced = _BRACED.fullmatch(match["braced"])
        if braced is None:
            raise InterpolationError(f"{_dotted(path)}: invalid interpolation format ${{{match['braced']}}}")
        name, operator, argument = braced["name"], braced["operator"], braced["argument"]
        current = environment.get(name)
        is_set, non_empty = current is not None, bool(current)
        if operator in (":?", "?") and not (non_empty if operator == ":?" else is_set):
            raise InterpolationError(f"{_dotted(path)}: required variable {name} is missing a value: {argument}")
        if operator == ":-":
            return current if non_empty else argument
        if operator == "-":
            return current if is_set else argument
        if operator == ":+":
            return argument if non_empty else ""
        if operator == "+":
            return argument if is_set else ""
        return current or ""

    return _EXPRESSION.sub(substitute, value)


def interpolate(node: Any, environment: Mapping[str, str], path: tuple[Any, ...] = ()) -> Any:
    """``node`` with every string value interpolated, as Compose does it: values only, never keys.

    Keys become strings, as Compose's loader makes them. Compose also casts a few interpolated
    values to numbers or booleans (``deploy.replicas`` ...); the schema accepts strings wherever
    that happens, so the check needs no cast.
    """
    if isinstance(node, dict):
        return {str(key): interpolate(value, environment, (*path, str(key))) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, environment, (*path, index)) for index, value in enumerate(node)]
    if isinstance(node, str):
        return _interpolate_string(node, environment, path)
    return node


@functools.cache
def _schema_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _specificity(error: jsonschema.ValidationError) -> int:
    # compose-go's getMostSpecificError: the deepest path, an unexpected key counting one deeper.
    return len(error.absolute_path) + (error.validator == "additionalProperties")


def _most_specific(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """Of a oneOf/anyOf failure's causes, the one that says where the document went wrong."""
    if not error.context:
        return error
    return max((_most_specific(cause) for cause in error.context), key=_specificity)


def schema_errors(document: Any) -> list[str]:
    """What the Compose schema refuses in ``document``, each message starting with the offending path."""
    errors = (_most_specific(error) for error in _schema_validator().iter_errors(document))
    return sorted(f"{_dotted(tuple(error.absolute_path))}: {error.message}" for error in errors)


@functools.cache
def docker_compose_answers() -> bool:
    """Whether this machine's Docker CLI has the compose plugin (its absence is not a failure)."""
    if shutil.which("docker") is None:
        return False
    result = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    return result.returncode == 0


def compose_file_errors(compose_file: Path) -> list[str]:
    """Everything Compose would refuse in ``compose_file``, read with dummy values for its required variables.

    Always the schema check; also `docker compose config` where the plugin answers. The project
    directory is the repository's, so relative paths in a copy resolve as in the real file.
    """
    text = compose_file.read_text()
    environment = dummy_environment(required_variables(text))
    errors = []
    try:
        document = interpolate(yaml.safe_load(text), environment)
    except InterpolationError as error:
        errors.append(f"interpolation: {error}")
    else:
        errors += [f"schema: {message}" for message in schema_errors(document)]
    if docker_compose_answers():
        result = subprocess.run(
            ["docker", "compose", "--project-directory", str(REPO_ROOT), "-f", str(compose_file), "config", "--quiet"],
            cwd=REPO_ROOT, env={**os.environ, **environment}, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            errors.append(f"docker compose: {result.stderr.strip()}")
    return errors


def test_docker_compose_yml_is_a_compose_file_that_compose_accepts():
    # The file's own required variables, set: the header comment names the same ones.
    assert {"DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_WORKER_PASSWORD",
            "TANDEM_TRAINER_TOKEN"} <= required_variables(COMPOSE_FILE.read_text())
    assert compose_file_errors(COMPOSE_FILE) == []


def _broken_copy(tmp_path: Path, breaks) -> Path:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    breaks(document["services"])
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False))
    return broken


def _misspell_ports(services):
    services["web"]["portz"] = services["web"].pop("ports")


def _ports_as_a_number(services):
    services["web"]["ports"] = 8000


def _healthcheck_retries_as_a_list(services):
    services["postgres"]["healthcheck"]["retries"] = [20]


@pytest.mark.parametrize(("breaks", "path", "words"), [
    (_misspell_ports, "services.web", "'portz'"),
    (_ports_as_a_number, "services.web.ports", "is not of type 'array'"),
    (_healthcheck_retries_as_a_list, "services.postgres.healthcheck.retries", "is not of type"),
])
def test_a_broken_compose_document_is_refused_naming_where_it_is_broken(tmp_path, breaks, path, words):
    errors = compose_file_errors(_broken_copy(tmp_path, breaks))
    assert any(error.startswith(f"schema: {path}: ") and words in error for error in errors), errors
    if docker_compose_answers():
        assert any(error.startswith("docker compose: ") for error in errors), errors


def test_the_checks_interpolation_reads_composes_syntax_and_refuses_an_unset_requirement():
    environment = {"SET": "value", "EMPTY": ""}
    cases = {
        "${SET}": "value", "$SET/x": "value/x", "${UNSET}": "", "${UNSET:-fallback}": "fallback",
        "${EMPTY:-fallback}": "fallback", "${EMPTY-fallback}": "", "${SET:+other}": "other",
        "${EMPTY:+other}": "", "${EMPTY+other}": "other", "$$SET": "$SET", "cost: $5": "cost: $5",
    }
    for written, expected in cases.items():
        assert interpolate({"key": written}, environment) == {"key": expected}, written
    for refused, words in [("${EMPTY:?needed}", "required variable EMPTY is missing a value: needed"),
                           ("${UNSET?needed}", "required variable UNSET"),
                           ("${SET:-${UNSET}}", "nested interpolation"), ("${1BAD}", "invalid interpolation")]:
        with pytest.raises(InterpolationError, match=re.escape(f"key: {words}")):
            interpolate({"key": refused}, environment)
