"""Which Python modules an environment registration may make a worker import: the operator's allow-list.

Registering a ``python`` environment names a ``module:Class``, and a
``gymnasium`` one a ``module:callable`` factory. Importing a module runs its
code, and calling a factory runs whatever it is (``os:system`` with a
``command`` keyword runs a shell command), on every worker that probes or
samples the environment, with the worker's credentials. So only modules the
operator installed on purpose may be named: the built-in environments
(``environments.builtin``) and the module prefixes listed, comma separated,
in ``TANDEM_ENVIRONMENT_MODULES`` (``my_team.envs`` allows ``my_team.envs``
and everything below it, never ``my_team.envs_other``). Nothing else is
imported: the platform refuses the registration (a 400 naming the field and
this setting) and workers refuse to load it, before any import.

The adapters' own modules (``environments.adapters``) are loaded only through
their kinds, never named by a ``python`` registration.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

ENVIRONMENT_MODULES_SETTING = "TANDEM_ENVIRONMENT_MODULES"
#: Always allowed: the environments that ship with Tandem.
BUILTIN_ENVIRONMENT_MODULES = ("environments.builtin",)

_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class EnvironmentModuleRefused(ValueError):
    """The named module is not one the operator allows environments to import."""


def allowed_environment_modules(configured: str | None = None) -> tuple[str, ...]:
    """The built-in prefixes and those of ``configured`` (default: the setting's environment variable)."""
    if configured is None:
        configured = os.environ.get(ENVIRONMENT_MODULES_SETTING, "")
    listed = tuple(part.strip() for part in configured.split(",") if part.strip())
    for prefix in listed:
        if not _DOTTED_NAME.match(prefix):
            raise ValueError(f"{ENVIRONMENT_MODULES_SETTING}: {prefix!r} is not a dotted module name")
    return (*BUILTIN_ENVIRONMENT_MODULES, *listed)


def check_environment_target(target: str, *, allowed: Iterable[str] | None = None) -> str:
    """The module of ``target`` (``module:attribute``) if the allow-list holds it; raises otherwise.

    Raises:
      EnvironmentModuleRefused: ``target`` is not ``module:attribute``, or its module lies
        under no allowed prefix; the message names the setting that would allow it.
    """
    module, separator, attribute = target.partition(":")
    if not separator or not _DOTTED_NAME.match(module) or not re.match(r"^[A-Za-z_]\w*$", attribute):
        raise EnvironmentModuleRefused(f"{target!r} is not of the form 'package.module:Name'")
    prefixes = allowed_environment_modules() if allowed is None else tuple(allowed)
    if not any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
        raise EnvironmentModuleRefused(
            f"module {module!r} is not allowed for environments: an operator can allow it by adding "
            f"it (or a package above it) to {ENVIRONMENT_MODULES_SETTING}, which now allows "
            f"{', '.join(prefixes)}"
        )
    return module
