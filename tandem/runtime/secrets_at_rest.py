"""Environment secret settings at rest: Fernet tokens, under keys from the operator's environment.

The platform stores a version's secret settings (``EnvironmentVersionSecrets``) and writes
them to Redis for workers (``tandem:secrets:...``) as Fernet tokens (``cryptography``:
AES-128-CBC with an HMAC-SHA256, authenticated), so neither a database dump nor a Redis
reader sees a value. Rollout workers decrypt them; the trainer never gets a key.

Keys come from ``TANDEM_SECRETS_KEY``: Fernet keys, comma separated. The first encrypts,
every one decrypts (MultiFernet), so rotating is: put a new key first, re-encrypt what is
stored (``manage.py tandem_rotate_secrets_key``), restart, then drop the old key. Or
``TANDEM_SECRETS_KEY_FILE``: a file holding the same (a Docker secret, or the local stack's
``<var dir>/secrets.key``, which :func:`secrets_key_file_ensure` writes on first start).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from tandem.contracts import EnvironmentSecrets

SECRETS_KEY_ENV = "TANDEM_SECRETS_KEY"
SECRETS_KEY_FILE_ENV = "TANDEM_SECRETS_KEY_FILE"
GENERATE_HINT = "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"


class SecretsKeyError(RuntimeError):
    """No key, a key that is not a Fernet key, or a token that none of the keys decrypts."""


def secrets_keys_from_environment(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The keys ``TANDEM_SECRETS_KEY`` (or the file ``TANDEM_SECRETS_KEY_FILE`` names) holds; [] if neither is set."""
    text = environ.get(SECRETS_KEY_ENV, "")
    path = environ.get(SECRETS_KEY_FILE_ENV, "")
    if not text.strip() and path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SecretsKeyError(f"{SECRETS_KEY_FILE_ENV}={path} cannot be read: {exc.strerror}") from None
    return [key.strip() for key in text.replace("\n", ",").split(",") if key.strip()]


def secrets_key_file_ensure(path: Path) -> Path:
    """``path``, holding a new Fernet key if it did not exist (readable by its owner only); for local stacks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path  # a stack started before, or another process got there first
    with os.fdopen(descriptor, "w") as file:
        file.write(Fernet.generate_key().decode() + "\n")
    return path


class SecretsCipher:
    """Encrypts with the first key, decrypts with any (MultiFernet)."""

    def __init__(self, keys: Sequence[str]):
        if not keys:
            raise SecretsKeyError(
                f"{SECRETS_KEY_ENV} is not set in this process's environment: the platform and the rollout "
                f"workers need the same Fernet key(s) to store and read environment secret settings "
                f"(generate one with {GENERATE_HINT})")
        fernets = []
        for position, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key))
            except ValueError:
                raise SecretsKeyError(
                    f"{SECRETS_KEY_ENV}: key {position} of {len(keys)} is not a Fernet key (32 bytes, "
                    f"URL-safe base64; generate one with {GENERATE_HINT})") from None
        self._keys = len(fernets)
        self._fernet = MultiFernet(fernets)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> SecretsCipher:
        return cls(secrets_keys_from_environment(environ))

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str | bytes) -> str:
        try:
            return self._fernet.decrypt(token).decode()
        except InvalidToken:
            raise SecretsKeyError(self._undecryptable()) from None

    def rotate(self, token: str) -> str:
        """``token`` encrypted under the first key; raises SecretsKeyError if no key decrypts it."""
        try:
            return self._fernet.rotate(token.encode()).decode()
        except InvalidToken:
            raise SecretsKeyError(self._undecryptable()) from None

    def _undecryptable(self) -> str:
        return (f"none of the {self._keys} key(s) in {SECRETS_KEY_ENV} decrypts the secret settings: this "
                f"process's key is not the platform's, or they were encrypted under a key since removed")


def environment_secrets_seal(record: EnvironmentSecrets, cipher: SecretsCipher) -> str:
    """What the platform writes under a ``tandem:secrets:`` key: a Fernet token of the record's JSON."""
    return cipher.encrypt(record.model_dump_json())


def environment_secrets_open(token: str | bytes, cipher: SecretsCipher) -> EnvironmentSecrets:
    """The record a ``tandem:secrets:`` key holds; raises SecretsKeyError if ``cipher`` cannot decrypt it."""
    return EnvironmentSecrets.model_validate_json(cipher.decrypt(token))
