"""``manage.py tandem_bootstrap``: a deployment's first user, its project and the trainer user, idempotently.

Applies migrations first, so it works on a fresh database. Prints one JSON
line on stdout and nothing else; progress goes to stderr.

A user it creates gets the password of ``--password``, else of the
``TANDEM_BOOTSTRAP_PASSWORD`` environment variable, else a generated one;
the JSON line shows it this once (``password``; null when the user already
existed). An existing user is never changed: no password reset, no
re-activation (a deactivated one is an error). Only hashes of tokens are
stored, so each run replaces both users' token named "bootstrap" and prints
the new ones; tokens printed by an earlier run stop working.
"""

import json
import os
import secrets
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.services import project_ensure, user_ensure_with_token, user_make_trainer
from common.domain_errors import Conflict
from environment_registry.builtin import BUILTIN_ENVIRONMENTS
from environment_registry.services import environment_ensure

PASSWORD_VARIABLE = "TANDEM_BOOTSTRAP_PASSWORD"


class Command(BaseCommand):
    help = "Create the first user, its project and environments, and the trainer user (if missing)."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default=None,
                            help=f"for a new user; default: ${PASSWORD_VARIABLE}, else generated")
        parser.add_argument("--project", default="default", help="Name of the user's project.")
        parser.add_argument("--trainer-username", default="tandem-trainer")

    def handle(self, *args, **options):
        # Migration progress would pollute the one JSON line callers parse.
        call_command("migrate", interactive=False, verbosity=0, stdout=sys.stderr)
        password = (options["password"] or os.environ.get(PASSWORD_VARIABLE)
                    or secrets.token_urlsafe(18))
        try:
            with transaction.atomic():
                user, user_token, created = user_ensure_with_token(
                    username=options["username"], password=password
                )
                project = project_ensure(owner=user, name=options["project"])
                for spec in BUILTIN_ENVIRONMENTS:
                    environment_ensure(user=user, project=project, spec=spec)
                # The trainer authenticates with its token only, so it has no usable password,
                # and acts through the trainers' group, not as staff.
                trainer, trainer_token, _ = user_ensure_with_token(
                    username=options["trainer_username"], password=None
                )
                user_make_trainer(user=trainer)
        except Conflict as error:
            raise CommandError(error.message) from None
        result = {
            "user_token": user_token,
            "trainer_token": trainer_token,
            "project_id": project.pk,
            "username": options["username"],
            "password": password if created else None,
        }
        self.stdout.write(json.dumps(result))
