"""Fixtures of the engine and sampler tests: their model, drawn once per module, and its full-forward reference."""

from __future__ import annotations

import pytest
from flax import nnx

from policy.model import Transformer, split_model
from tests.policy.sampling_reference import CONFIG, full_forward_logprobs


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def params(model) -> nnx.State:
    return split_model(model)[1]


@pytest.fixture(scope="module")
def forward_logprobs(model):
    return full_forward_logprobs(model)
