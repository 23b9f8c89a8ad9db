from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    # The module is not named `environments`: that is the top-level package of
    # environment code, which a test process imports beside the platform. The
    # label keeps its old name, so tables, migrations and "environments.Environment"
    # references are unchanged.
    name = "environment_registry"
    label = "environments"
