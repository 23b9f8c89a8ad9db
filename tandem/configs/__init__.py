"""Configuration: the typed, documented run config and its sections, the operator's caps on it, and the demo runs.

The floor under the contracts: it imports no other part of Tandem.
"""
