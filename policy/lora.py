"""Low-rank adapters on the policy's projections, added after the model is built.

:func:`apply_lora` swaps chosen ``nnx.Linear`` projections of every block for
:class:`LoRALinear`, which keeps the base kernel (the same array, not a copy)
at the same path (``blocks/0/attention/query/kernel``) and adds ``lora_a``
and ``lora_b`` as ``nnx.LoRAParam``. Two things follow:

- The parameters of a LoRA model minus its ``nnx.LoRAParam`` leaves have
  exactly the structure of the plain model's, so base weights can be
  published, checkpointed and sharded as if LoRA did not exist.
- The model's own parameters become :class:`FrozenParam`. Both it and
  ``nnx.LoRAParam`` subclass ``nnx.Param``, so ``split_model`` still takes
  every parameter; the train step leaves ``FrozenParam`` alone and trains
  everything else: the adapters, and anything added to the model after
  ``apply_lora`` (a PPO value head), which starts from scratch and must learn.

Producers never see the adapters as such: :func:`fold_adapters` merges them
into the base kernels (``W + scale · A @ B``), giving plain-model parameters.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from policy.model import Transformer
from tandem.configs.parallelism import LoRAConfig


class FrozenParam(nnx.Param):
    """A pretrained parameter that LoRA keeps fixed; an ``nnx.Param`` to everyone else."""


def _freeze(model: nnx.Module) -> None:
    """Retype every plain ``nnx.Param`` of ``model`` as :class:`FrozenParam`, keeping sharing."""
    frozen: dict[int, FrozenParam] = {}
    for _, module in nnx.iter_modules(model):
        for name, value in list(vars(module).items()):
            if type(value) is nnx.Param:
                if id(value) not in frozen:
                    frozen[id(value)] = FrozenParam(value.get_raw_value(), **value.get_metadata())
                setattr(module, name, frozen[id(value)])
    missed = ["/".join(map(str, path)) for path, node in nnx.iter_graph(model)
              if type(node) is nnx.Param]
    if missed:
        raise ValueError(f"cannot freeze parameters not held as module attributes: {missed}")


class LoRALinear(nnx.Linear):
    """``y = x @ W (+ b) + scale · (x @ A) @ B`` with ``W`` (and ``b``) taken over from a Linear.

    ``A`` [in, rank] starts He-uniform and ``B`` [rank, out] at zero, so the
    adapted layer starts out computing exactly what the base layer did.
    """

    def __init__(self, base: nnx.Linear, *, rank: int, scale: float, rngs: nnx.Rngs):
        # nnx.Linear.__init__ is skipped on purpose: it would allocate a fresh
        # kernel. Taking over the base's variables and settings instead keeps
        # the kernel's identity and path, and Linear.__call__ works unchanged.
        for name, value in vars(base).items():
            if not name.startswith("_"):
                setattr(self, name, value)
        self.rank = rank
        self.scale = scale
        self.lora_a = nnx.LoRAParam(
            nnx.initializers.he_uniform()(rngs.params(), (base.in_features, rank), np.float32)
        )
        self.lora_b = nnx.LoRAParam(
            nnx.initializers.zeros(rngs.params(), (rank, base.out_features), np.float32)
        )

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        y = super().__call__(inputs, out_sharding=out_sharding)
        x, lora_a, lora_b = self.promote_dtype(
            (inputs, self.lora_a[...], self.lora_b[...]), dtype=self.dtype
        )
        return y + ((x @ lora_a) @ lora_b * self.scale).astype(y.dtype)


def apply_lora(model: Transformer, config: LoRAConfig, *, rngs: nnx.Rngs) -> Transformer:
    """Freeze ``model`` and add adapters to ``config.targets`` of every block, in place; returns it.

    Nothing happens when ``config.enabled`` is False. Base kernels are shared,
    not copied, so the model's outputs are unchanged until the adapters train.
    Apply it to the bare policy (after loading pretrained weights, before
    adding a value head), so that only the policy's own weights are frozen.

    Raises:
      ValueError: ``model`` has no ``blocks``, a target is missing from a
        block or is not an ``nnx.Linear``, or the model already has adapters.
    """
    if not config.enabled:
        return model
    if not hasattr(model, "blocks"):
        raise ValueError(
            f"apply_lora needs the policy Transformer, got {type(model).__name__}; "
            "apply it before wrapping the policy (e.g. with a value head)"
        )
    _freeze(model)
    for index, block in enumerate(model.blocks):
        for target in config.targets:
            *parents, name = target.split(".")
            owner = block
            for parent in parents:
                owner = getattr(owner, parent, None)
            base = getattr(owner, name, None)
            if isinstance(base, LoRALinear):
                raise ValueError(f"blocks/{index}/{target} already has LoRA adapters")
            if not isinstance(base, nnx.Linear):
                raise ValueError(f"blocks/{index}/{target} is not an nnx.Linear, cannot adapt it")
            setattr(owner, name, LoRALinear(base, rank=config.rank, scale=config.scale, rngs=rngs))
    return model


def split_adapters(params: nnx.State) -> tuple[nnx.State, nnx.State]:
    """``(adapters, base)``: the ``nnx.LoRAParam`` leaves, and everything else."""
    return nnx.split_state(params, nnx.LoRAParam, ...)


def fold_adapters(base: dict, adapters: dict, scale: float) -> dict:
    """Plain-model parameters: ``kernel + scale · lora_a @ lora_b`` wherever there is an adapter.

    Args:
      base: pure dict (``nnx.to_pure_dict``) of the parameters without adapters,
        numpy or jax arrays; not modified.
      adapters: pure dict of the ``nnx.LoRAParam`` leaves, nested the same way
        (``{..., "query": {"lora_a": A, "lora_b": B}}``).
      scale: ``alpha / rank`` of the run.
    Returns:
      A new pure dict shaped like ``base`` with numpy leaves.
    """

    def fold(base_node, adapter_node, path):
        if not isinstance(base_node, dict):
            return np.asarray(base_node)
        adapter_node = adapter_node or {}
        unknown = set(adapter_node) - set(base_node) - {"lora_a", "lora_b"}
        if unknown:
            raise ValueError(f"adapters at {path} have no base parameters: {sorted(unknown)}")
        folded = {
            key: fold(value, adapter_node.get(key), f"{path}/{key}")
            for key, value in base_node.items()
        }
        if "lora_a" in adapter_node:
            kernel = folded["kernel"]
            delta = np.asarray(adapter_node["lora_a"], np.float32) @ np.asarray(
                adapter_node["lora_b"], np.float32
            )
            folded["kernel"] = (kernel.astype(np.float32) + scale * delta).astype(kernel.dtype)
        return folded

    return fold(base, adapters, "")
