"""The trainer's step telemetry: stored as metric points, served for charts, broadcast live."""
