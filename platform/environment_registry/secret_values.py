"""A version's secret settings at rest: one Fernet token of their JSON (tandem/runtime/secrets_at_rest.py).

Under ``settings.TANDEM_SECRETS_KEYS``, from the operator's environment; nothing else in the
platform encrypts or decrypts them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from django.conf import settings

from tandem.contracts import EnvironmentSecrets
from tandem.runtime.secrets_at_rest import SecretsCipher, environment_secrets_seal


def platform_secrets_cipher() -> SecretsCipher:
    """Raises SecretsKeyError without a key (config.settings.prod refuses to start then)."""
    return SecretsCipher(settings.TANDEM_SECRETS_KEYS)


def secret_values_seal(values: Mapping[str, str]) -> str:
    """What ``EnvironmentVersionSecrets.ciphertext`` holds for ``values`` (name -> value)."""
    return platform_secrets_cipher().encrypt(json.dumps(dict(values), sort_keys=True))


def secret_values_open(ciphertext: str) -> dict[str, str]:
    """The name -> value of a ``ciphertext``; raises SecretsKeyError if no key decrypts it."""
    return json.loads(platform_secrets_cipher().decrypt(ciphertext))


def secrets_record_seal(*, version_id: int, values: Mapping[str, str]) -> str:
    """What the platform writes under a ``tandem:secrets:`` Redis key for workers."""
    record = EnvironmentSecrets(version_id=version_id, settings=dict(values))
    return environment_secrets_seal(record, platform_secrets_cipher())
