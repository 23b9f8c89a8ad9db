"""The ``tandem`` command line and the local stack it starts (``tandem up``)."""

from tandem.cli.commands import main

__all__ = ["main"]
