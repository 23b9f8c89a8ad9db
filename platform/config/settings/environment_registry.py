"""The environment registry: where remote environments may live, and how long a probe may stay unanswered."""

import json

from django.core.exceptions import ImproperlyConfigured

from tandem.allowlists.agent_commands import configured_agent_commands
from tandem.allowlists.environment_modules import allowed_environment_modules
from tandem.allowlists.mcp_servers import configured_mcp_servers
from tandem.runtime.secrets_at_rest import (
    SecretsCipher,
    SecretsKeyError,
    secrets_keys_from_environment,
)

from .env_vars import env_list, env_str

# Module prefixes `python` environments and `gymnasium` factories may name
# (tandem/allowlists/environment_modules.py): the built-ins and TANDEM_ENVIRONMENT_MODULES.
# Workers read the same variable and refuse the rest before importing anything.
TANDEM_ENVIRONMENT_MODULES = allowed_environment_modules()

# The MCP servers an environment may take tools from, name to argv (tandem/allowlists/mcp_servers.py);
# a registration names one, and workers start only these. Unset: none.
TANDEM_MCP_SERVERS = configured_mcp_servers()

# The agent programs an `agent` environment may run per episode, name to argv
# (tandem/allowlists/agent_commands.py); a registration names one, and workers start only these. Unset: none.
TANDEM_AGENT_COMMANDS = configured_agent_commands()

# Hosts and networks remote environment URLs may reach (tandem/allowlists/environment_urls.py).
# Unset: everything except link-local and cloud-metadata addresses.
TANDEM_ENVIRONMENT_URL_ALLOWLIST = env_list("TANDEM_ENVIRONMENT_URL_ALLOWLIST", []) or None
# Whether private and loopback addresses not on that list are refused too (tandem/allowlists/environment_urls.py);
# the production settings refuse them, development allows them (environments on the laptop).
TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = env_str("TANDEM_ENVIRONMENT_URL_PRIVATE", "allow") == "refuse"
# A probe no worker reported on within this long fails: no worker consumes the `probes` queue.
TANDEM_PROBE_EXPIRY_S = float(env_str("TANDEM_PROBE_EXPIRY_S", "600"))
# Per-check probe timeouts in seconds, JSON, e.g. {"reset": 5}; unset ones keep
# tandem.contracts.ProbeTimeouts' defaults.
TANDEM_PROBE_TIMEOUTS = json.loads(env_str("TANDEM_PROBE_TIMEOUTS", "{}"))
# An imported model's directory (under TANDEM_MODEL_ROOTS) whose baseline every registration probe plays
# when the registration names none: a few held-out episodes and its tool-call rate (workers/probe_baseline.py).
# Unset: only registrations that ask for one (`baseline`) get one.
TANDEM_PROBE_BASELINE_MODEL = env_str("TANDEM_PROBE_BASELINE_MODEL", "")
# Fernet keys environments' secret settings are encrypted under, in the database and in Redis
# (tandem/runtime/secrets_at_rest.py): TANDEM_SECRETS_KEY, or the file TANDEM_SECRETS_KEY_FILE names.
# The first encrypts, all decrypt; rollout workers need the same keys, the trainer none.
# Unset, dev.py writes one to var/secrets.key and prod.py refuses to start.
try:
    TANDEM_SECRETS_KEYS = secrets_keys_from_environment()
    if TANDEM_SECRETS_KEYS:
        SecretsCipher(TANDEM_SECRETS_KEYS)  # a malformed key stops the start, not the first registration
except SecretsKeyError as error:
    raise ImproperlyConfigured(str(error)) from None
# Health check probes kept per version (the health history); older ones are deleted.
TANDEM_HEALTH_PROBES_KEPT = int(env_str("TANDEM_HEALTH_PROBES_KEPT", "500"))
