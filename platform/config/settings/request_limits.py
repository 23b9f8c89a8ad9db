"""Request bodies: how large and how slow a body may be, enforced in front of Django
(common/request_limits.py), before authentication and before anything is spooled to disk."""

from .datasets import TANDEM_DATASET_MAX_BYTES
from .env_vars import env_float, env_str

# Every body but an upload's: JSON posts, forms. The trainer keeps its posts under 2 MiB
# (trainer/platform_client.py: MAX_TELEMETRY_POST_BYTES) and Django reads at most 2.5 MiB of a
# non-file body (DATA_UPLOAD_MAX_MEMORY_SIZE), so a larger one could only be refused later.
TANDEM_REQUEST_MAX_BYTES = int(env_str("TANDEM_REQUEST_MAX_BYTES", str(4 * 2**20)))
# Seconds a body (not an upload's) may take to arrive, counted from the request's start: a client
# that trickles one must not hold a connection, and its worker's memory, for ever (a 408 then).
TANDEM_REQUEST_BODY_TIMEOUT_S = env_float("TANDEM_REQUEST_BODY_TIMEOUT_S", 30.0)
# The profiler traces a trainer hands in, zipped (api-trainer-trace-upload).
TANDEM_TRACE_MAX_BYTES = int(env_str("TANDEM_TRACE_MAX_BYTES", str(512 * 2**20)))
# Seconds an upload (a dataset, a trace) may take to arrive: a cap's worth at about 1 MiB/s.
TANDEM_UPLOAD_BODY_TIMEOUT_S = env_float("TANDEM_UPLOAD_BODY_TIMEOUT_S", 600.0)
# Room around an uploaded file for the form's other fields and the multipart boundaries; the
# dataset upload's handler (dataset_registry/uploads.py) still holds the file to its exact cap.
UPLOAD_FORM_OVERHEAD_BYTES = 2**20
# Routes (by URL name) whose bodies may be larger than TANDEM_REQUEST_MAX_BYTES: the uploads,
# each as (most bytes, seconds to arrive). Every other route gets the defaults above.
TANDEM_REQUEST_BODY_LIMITS_BY_ROUTE = {
    "api-datasets": (TANDEM_DATASET_MAX_BYTES + UPLOAD_FORM_OVERHEAD_BYTES, TANDEM_UPLOAD_BODY_TIMEOUT_S),
    "dataset-list-page": (TANDEM_DATASET_MAX_BYTES + UPLOAD_FORM_OVERHEAD_BYTES, TANDEM_UPLOAD_BODY_TIMEOUT_S),
    "api-trainer-trace-upload": (TANDEM_TRACE_MAX_BYTES + UPLOAD_FORM_OVERHEAD_BYTES, TANDEM_UPLOAD_BODY_TIMEOUT_S),
}
