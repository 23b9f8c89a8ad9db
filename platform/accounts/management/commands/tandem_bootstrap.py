"""``manage.py tandem_bootstrap``: a ready-to-use demo user, project and trainer, idempotently.

Applies migrations first, so it works on a fresh database. Prints one JSON
line on stdout and nothing else; progress goes to stderr. Only hashes of tokens
are stored, so each run replaces both users' token named "bootstrap" and prints
the new ones; tokens printed by an earlier run stop working.
"""

import json
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.services import project_ensure, user_ensure_with_token
from environment_registry.builtin import BUILTIN_ENVIRONMENTS
from environment_registry.services import environment_ensure


class Command(BaseCommand):
    help = "Create (or bring in line) the demo user, its project and environments, and the trainer user."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo")
        parser.add_argument("--project", default="demo", help="Name of the demo user's project.")
        parser.add_argument("--trainer-username", default="tandem-trainer")

    def handle(self, *args, **options):
        # Migration progress would pollute the one JSON line callers parse.
        call_command("migrate", interactive=False, verbosity=0, stdout=sys.stderr)
        with transaction.atomic():
            user, user_token = user_ensure_with_token(
                username=options["username"], password=options["password"]
            )
            project = project_ensure(owner=user, name=options["project"])
            for spec in BUILTIN_ENVIRONMENTS:
                environment_ensure(user=user, project=project, spec=spec)
            # The trainer authenticates with its token only, so it has no usable password.
            _, trainer_token = user_ensure_with_token(
                username=options["trainer_username"], password=None, is_staff=True
            )
        result = {
            "user_token": user_token,
            "trainer_token": trainer_token,
            "project_id": project.pk,
            "username": options["username"],
            "password": options["password"],
        }
        self.stdout.write(json.dumps(result))
