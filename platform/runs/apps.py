from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        # Runs import environments, never the reverse: the registry learns from here what a
        # version's failed probe means for the runs pinned to it.
        from environment_registry.services import VERSION_FAILED_HANDLERS

        from .services import runs_fail_queued_of_version

        if runs_fail_queued_of_version not in VERSION_FAILED_HANDLERS:
            VERSION_FAILED_HANDLERS.append(runs_fail_queued_of_version)

        # Likewise datasets: a version a run that has not ended pins is not deleted under it.
        from dataset_registry.services import VERSION_USERS

        from .selectors import runs_using_dataset_version

        if runs_using_dataset_version not in VERSION_USERS:
            VERSION_USERS.append(runs_using_dataset_version)
