"""SFT datasets: how large an upload may be, a project's quota, and where a dataset may be read from by path."""

from tandem.allowlists.dataset_paths import dataset_roots

from .env_vars import env_str

# Largest dataset file accepted (an upload or a file read by path), in bytes: the web process
# checks every row of it and the datasets worker stores them, so this bounds one registration's work.
TANDEM_DATASET_MAX_BYTES = int(env_str("TANDEM_DATASET_MAX_BYTES", str(256 * 2**20)))
# A project's dataset quota: the bytes of all its versions' files, and how many versions it keeps
# (failed ones are not counted). One team cannot fill the database's disk; deleting a version frees room.
TANDEM_DATASET_PROJECT_MAX_BYTES = int(env_str("TANDEM_DATASET_PROJECT_MAX_BYTES", str(4 * 2**30)))
TANDEM_DATASET_PROJECT_MAX_VERSIONS = int(env_str("TANDEM_DATASET_PROJECT_MAX_VERSIONS", "100"))
# How long the datasets worker may take to store one version (Celery's soft limit; the hard one is a
# minute later): at about 10 MiB/s, far more than the largest file needs.
TANDEM_DATASET_STORE_TIME_LIMIT_S = int(env_str("TANDEM_DATASET_STORE_TIME_LIMIT_S", "1800"))
# A version left in "checking" this long had its web process die mid-check: it no longer counts
# as its user's upload in progress (checking the largest file takes well under a minute).
TANDEM_DATASET_CHECK_ABANDONED_S = int(env_str("TANDEM_DATASET_CHECK_ABANDONED_S", "900"))
# Directories a dataset may be registered from by path on the platform's host (TANDEM_DATASET_ROOTS,
# comma separated; default var/datasets): tandem/allowlists/dataset_paths.py.
TANDEM_DATASET_ROOTS = dataset_roots()
