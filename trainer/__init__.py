"""The JAX trainer: models, sampler, losses, train step and the trainer process."""
