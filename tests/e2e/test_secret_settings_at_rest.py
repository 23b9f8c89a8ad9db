"""Issue 28, finding 18: on a whole stack, secret settings are ciphertext at rest and a real worker decrypts them.

The stack's processes inherit the suite's TANDEM_SECRETS_KEY (config.settings.test), as
`tandem up` hands its key to the platform and the rollout workers. The probe of a version
whose environment rewards 1 only with the right key passes its step check: the worker
process decrypted the Redis copy. The database row, read raw, holds no value.
"""

from __future__ import annotations

import psycopg

from tests.e2e.conftest import registration_probed, user_api
from tests.workers.secret_environments import API_KEY


def test_a_worker_process_probes_with_a_secret_setting_stored_encrypted(stack, credentials, e2e_database_url):
    local, _ = stack
    api = user_api(local, credentials)
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": "keyed-at-rest", "kind": "python",
        "entrypoint": "tests.workers.secret_environments:KeyedEnvironment", "settings": {"greeting": "hi"},
        "secret_settings": {"api_key": API_KEY}})
    assert registered.status_code == 201, registered.text
    version, probe = registration_probed(local, api, registered.json()["id"])

    assert version["status"] == "ready", version
    step = next(check for check in probe["checks"] if check["name"] == "step")
    assert step["message"] == "reward 1, done True"  # KeyedEnvironment got the decrypted key
    with psycopg.connect(e2e_database_url) as connection:
        rows = connection.execute("SELECT * FROM environments_environmentversionsecrets "
                                  "WHERE version_id = %s", (version["id"],)).fetchall()
    assert len(rows) == 1 and not any(API_KEY in str(value) for value in rows[0])
