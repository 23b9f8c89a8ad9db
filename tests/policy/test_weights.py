"""Choosing a run's weight transport (the transports themselves: tests/trainer/test_weight_transports.py)."""

from __future__ import annotations

import pytest

from policy.weights import FilesystemWeightPublisher, RedisWeightPublisher, weight_publisher
from tandem.parallelism_config import LoRAConfig


def test_the_run_s_transport_picks_its_publisher(redis_client, tmp_path):
    redis_publisher = weight_publisher(redis_client, transport="redis", lora=LoRAConfig(enabled=True))
    assert isinstance(redis_publisher, RedisWeightPublisher)
    assert redis_publisher._lora_scale == LoRAConfig(enabled=True).scale  # adapters travel alone
    filesystem_publisher = weight_publisher(redis_client, transport="filesystem", directory=tmp_path)
    assert isinstance(filesystem_publisher, FilesystemWeightPublisher)
    with pytest.raises(ValueError, match="needs a directory"):
        weight_publisher(redis_client, transport="filesystem")
