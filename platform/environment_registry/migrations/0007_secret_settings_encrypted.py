"""Secret settings at rest are Fernet tokens (issue 28, finding 18): the stored values are encrypted
under TANDEM_SECRETS_KEY's first key, and the plain-text column goes."""

from django.db import migrations, models

from environment_registry.secret_values import secret_values_open, secret_values_seal


def encrypt_values(apps, schema_editor):
    secrets = apps.get_model("environments", "EnvironmentVersionSecrets")
    for row in secrets.objects.all():
        row.ciphertext = secret_values_seal(row.values)
        row.save(update_fields=["ciphertext"])


def decrypt_values(apps, schema_editor):
    secrets = apps.get_model("environments", "EnvironmentVersionSecrets")
    for row in secrets.objects.all():
        row.values = secret_values_open(row.ciphertext)
        row.save(update_fields=["values"])


class Migration(migrations.Migration):

    dependencies = [
        ("environments", "0006_episode_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="environmentversionsecrets",
            name="ciphertext",
            field=models.TextField(default="", help_text="A Fernet token of the JSON setting name -> value, under TANDEM_SECRETS_KEY's first key when it was written (environment_registry.secret_values)."),
            preserve_default=False,
        ),
        migrations.RunPython(encrypt_values, decrypt_values),
        migrations.RemoveField(model_name="environmentversionsecrets", name="values"),
    ]
