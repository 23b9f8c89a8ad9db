from django.apps import AppConfig


class RunLogsConfig(AppConfig):
    name = "run_logs"
    verbose_name = "Run logs"
