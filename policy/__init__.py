"""The policy, as both processes run it: model, tokenizers, prompt formats, weights, inference."""
