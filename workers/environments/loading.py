"""Resolve an environment registration to a class, with errors that say what is wrong."""

from __future__ import annotations

import importlib

from tandem.contracts import EnvironmentSpec
from workers.environments.base import Environment


class EnvironmentLoadError(RuntimeError):
    pass


def load_environment_class(spec: EnvironmentSpec) -> type[Environment]:
    module_name, _, class_name = spec.entrypoint.partition(":")
    if not module_name or not class_name:
        raise EnvironmentLoadError(f"entrypoint {spec.entrypoint!r} is not of the form module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentLoadError(f"cannot import {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise EnvironmentLoadError(f"{spec.entrypoint!r} is not a workers.environments.Environment subclass")
    return cls
