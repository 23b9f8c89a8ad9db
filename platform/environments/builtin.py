"""Environments that ship with Tandem and are registered by ``tandem_bootstrap``."""

from tandem.contracts import EnvironmentSpec

CALCULATOR = EnvironmentSpec(
    name="calculator",
    kind="python",
    entrypoint="workers.environments.calculator:CalculatorEnvironment",
    params={},
)

BUILTIN_ENVIRONMENTS = (CALCULATOR,)
