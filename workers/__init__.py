"""Rollout producers: Celery app and tasks, the episode loop, the agent and the probe."""
