"""Environment interface, built-in environments and loading by entrypoint."""

from environments.base import (
    Demonstration,
    DemonstrationTurn,
    Environment,
    StepResult,
    Tool,
)
from environments.loading import EnvironmentLoadError, load_environment_class

__all__ = [
    "Demonstration",
    "DemonstrationTurn",
    "Environment",
    "EnvironmentLoadError",
    "StepResult",
    "Tool",
    "load_environment_class",
]
