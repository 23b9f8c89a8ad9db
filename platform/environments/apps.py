from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    name = "environments"
