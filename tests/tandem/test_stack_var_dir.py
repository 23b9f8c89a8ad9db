"""Two stacks of one checkout, each with a var directory of its own (``tandem up --var-dir``), share nothing.

The stacks run the embedded SQLite (``StackConfig.database_url`` None), as ``tandem up`` does without a
``DATABASE_URL``: their databases must be two files, each in its own var directory, or the second
stack's bootstrap would replace the first one's trainer token and each trainer would claim the
other's runs.
"""

from __future__ import annotations

import httpx

from tandem.cli.stack import LocalStack, StackConfig
from tandem.contracts import TRAINER_HEADER
from tandem.runtime.local_ports import free_local_port


def _embedded_sqlite_stack(var_dir, redis_url: str) -> LocalStack:
    return LocalStack(StackConfig(redis_url=redis_url, database_url=None, port=free_local_port(), workers=0,
                                  var_dir=var_dir))


def test_stacks_with_var_dirs_of_their_own_keep_databases_and_trainer_tokens_of_their_own(tmp_path, redis_url):
    first = _embedded_sqlite_stack(tmp_path / "first", redis_url)
    second = _embedded_sqlite_stack(tmp_path / "second", redis_url)
    first_credentials = first.prepare()
    second_credentials = second.prepare()

    for stack in (first, second):
        database = stack.config.var_dir / "tandem.sqlite3"
        assert database.is_file(), f"no database in {stack.config.var_dir}: {sorted(stack.config.var_dir.iterdir())}"
    assert first_credentials.trainer_token != second_credentials.trainer_token

    # The second bootstrap left the first stack's trainer token alone: the first platform takes it.
    first.start_web()
    try:
        claim = httpx.post(f"{first.config.platform_url}/api/trainer/claim/", json={"worker": "test-host:1"},
                           headers={"Authorization": f"Token {first_credentials.trainer_token}",
                                    TRAINER_HEADER: "test-host:1"}, timeout=10)
        assert claim.status_code == 204, claim.text  # authenticated, and no run is queued there
        stranger = httpx.post(f"{first.config.platform_url}/api/trainer/claim/", json={"worker": "test-host:1"},
                              headers={"Authorization": f"Token {second_credentials.trainer_token}",
                                       TRAINER_HEADER: "test-host:1"}, timeout=10)
        assert stranger.status_code == 401, stranger.text  # the other stack's trainer is not known here
    finally:
        first.stop()


def test_a_stack_without_an_operators_key_seals_secrets_with_its_own_which_the_trainer_never_gets(
        tmp_path, redis_url, monkeypatch):
    from tandem.runtime.secrets_at_rest import (
        SECRETS_KEY_ENV,
        SECRETS_KEY_FILE_ENV,
        secrets_keys_from_environment,
    )

    monkeypatch.delenv(SECRETS_KEY_ENV, raising=False)
    monkeypatch.delenv(SECRETS_KEY_FILE_ENV, raising=False)
    first = _embedded_sqlite_stack(tmp_path / "first", redis_url)
    second = _embedded_sqlite_stack(tmp_path / "second", redis_url)
    env = first.env()
    assert env[SECRETS_KEY_FILE_ENV] == str(tmp_path / "first" / "secrets.key")
    # Written once, then kept: a restarted process opens what the last one sealed.
    assert secrets_keys_from_environment(first.env()) == secrets_keys_from_environment(env)
    assert secrets_keys_from_environment(second.env()) != secrets_keys_from_environment(env)
    assert not {SECRETS_KEY_ENV, SECRETS_KEY_FILE_ENV} & set(first._trainer_env())
