"""Rollout producers: Celery app, agent loop, environments and the stream writer."""
