"""The Python SDK: ``TandemClient`` speaks the platform's REST API for scripts, notebooks and the command line."""

from tandem.sdk.client import TandemAPIError, TandemClient

__all__ = ["TandemAPIError", "TandemClient"]
