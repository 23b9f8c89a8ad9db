"""Training runs: their lifecycle, the trainer's claim on them, and their live page."""
