"""The JAX trainer process: rollout feed, losses, advantages, train step, sharding, checkpoints."""
