"""The platform's run statuses and environment kinds are the contracts' own, and changing them needs no migration."""

import pytest
from django.core.management import call_command

from environment_registry.models import EnvironmentVersion
from runs.models import Run
from runs.services import LEGAL_TRANSITIONS
from tandem.contracts import (
    ENVIRONMENT_KINDS,
    EnvironmentKindDefinition,
    RequiredSetting,
    RunStatus,
    environment_kind_choices,
    run_status_choices,
)
from tandem.contracts import environments as environment_contracts


def test_a_runs_statuses_are_the_contracts_run_statuses():
    assert Run._meta.get_field("status").choices == run_status_choices()
    assert Run.Status.values == [status.value for status in RunStatus]
    assert set(LEGAL_TRANSITIONS) == set(RunStatus)


def test_an_environment_versions_kinds_are_the_contracts_table():
    assert EnvironmentVersion._meta.get_field("kind").choices == environment_kind_choices()
    assert EnvironmentVersion.Kind.values == list(ENVIRONMENT_KINDS)


@pytest.mark.django_db
def test_the_models_need_no_migration():
    call_command("makemigrations", check=True, dry_run=True, verbosity=0)


@pytest.mark.django_db
def test_a_new_kind_in_the_table_needs_no_migration(monkeypatch):
    extended = {**ENVIRONMENT_KINDS, "toy": EnvironmentKindDefinition(
        label="Toy adapter", adapter_entrypoint="toys.adapter:ToyEnvironment",
        required_settings=(RequiredSetting("token", "a toy token"),),
    )}
    monkeypatch.setattr(environment_contracts, "ENVIRONMENT_KINDS", extended)

    assert ("toy", "Toy adapter") in EnvironmentVersion._meta.get_field("kind").choices
    call_command("makemigrations", check=True, dry_run=True, verbosity=0)
