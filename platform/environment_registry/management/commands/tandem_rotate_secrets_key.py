"""``manage.py tandem_rotate_secrets_key``: re-encrypt environments' secret settings under the first key.

Rotating the key of secret settings at rest (docs/deploy.md, "Secret settings key"): put
the new key first in TANDEM_SECRETS_KEY, the old one after it, in every platform process
and rollout worker; run this; then drop the old key. Until then the old key still decrypts
(MultiFernet), so nothing stops while the key list changes.
"""

from django.core.management.base import BaseCommand, CommandError

from environment_registry.services import environment_secrets_rotate
from tandem.runtime.secrets_at_rest import SecretsKeyError


class Command(BaseCommand):
    help = "Re-encrypt every environment's secret settings (database and Redis) under TANDEM_SECRETS_KEY's first key."

    def handle(self, *args, **options):
        try:
            rotation = environment_secrets_rotate()
        except SecretsKeyError as error:
            raise CommandError(f"{error}; nothing was changed") from None
        self.stdout.write(
            f"Re-encrypted {rotation.versions} stored version(s)' secret settings and "
            f"{rotation.redis_values} Redis value(s) under the first key of TANDEM_SECRETS_KEY."
        )
        if rotation.redis_values_skipped:
            self.stdout.write(
                f"Left {rotation.redis_values_skipped} Redis value(s) that changed meanwhile or that no key "
                "decrypts; the platform writes them again at the next claim or probe."
            )
