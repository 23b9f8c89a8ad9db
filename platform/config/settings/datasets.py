"""SFT datasets: how large an upload may be, and where a dataset may be read from by path."""

from tandem.dataset_paths import dataset_roots

from .env_vars import env_str

# Largest dataset file accepted (an upload or a file read by path), in bytes: every row is
# validated and stored in one transaction, so this bounds the work of one registration.
TANDEM_DATASET_MAX_BYTES = int(env_str("TANDEM_DATASET_MAX_BYTES", str(256 * 2**20)))
# Directories a dataset may be registered from by path on the platform's host (TANDEM_DATASET_ROOTS,
# comma separated; default var/datasets): tandem/dataset_paths.py.
TANDEM_DATASET_ROOTS = dataset_roots()
