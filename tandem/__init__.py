"""Tandem: cross-process contracts, run configuration and the command line."""
