import json

from django import forms

from common.form_errors import DomainErrorForm


class RunCreateForm(DomainErrorForm):
    """The dashboard's "new run": a project, one of its environments, and the run's length."""

    project = forms.TypedChoiceField(coerce=int)
    environment = forms.ChoiceField()
    name = forms.CharField(max_length=200, required=False)
    sft_steps = forms.IntegerField(required=False, min_value=0, label="SFT steps")
    rl_steps = forms.IntegerField(required=False, min_value=0, label="RL steps")

    def __init__(self, *args, projects, environments, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(project.pk, project.name) for project in projects]
        # Grouped by project; the service checks that the pair matches.
        groups: dict[str, list[tuple[str, str]]] = {}
        for environment in environments:
            groups.setdefault(environment.project.name, []).append(
                (environment.name, environment.name)
            )
        self.fields["environment"].choices = list(groups.items())

    def config(self) -> dict:
        """The partial RunConfig the form describes; RunConfig's defaults fill the rest."""
        return {
            key: self.cleaned_data[key]
            for key in ("sft_steps", "rl_steps")
            if self.cleaned_data.get(key) is not None
        }

    def error_inputs(self) -> dict[str, str]:
        """A service names the run's length by its config path (``config.rl_steps`` -> rl_steps)."""
        return {f"config.{name}" if name in ("sft_steps", "rl_steps") else name: name for name in self.fields}


class _ConfigJSONField(forms.JSONField):
    """A config shown indented, keys sorted, like on the run page, so it can be read and edited."""

    def prepare_value(self, value):
        if isinstance(value, dict):
            return json.dumps(value, indent=2, sort_keys=True)
        return super().prepare_value(value)


class RunCloneForm(DomainErrorForm):
    """"Clone from run": the run's name and whole config, prefilled, to edit before queueing the copy.

    A service's error about ``config.<path>`` shows under the config, naming the path.
    """

    name = forms.CharField(max_length=200, required=False)
    config = _ConfigJSONField(
        help_text="The original run's config; what you change here differs in the clone.",
        widget=forms.Textarea(attrs={"rows": 24, "cols": 60, "spellcheck": "false"}),
    )

    def __init__(self, *args, run, **kwargs):
        kwargs.setdefault("initial", {"name": f"{run.name} (clone)"[:200], "config": run.config})
        super().__init__(*args, **kwargs)

    def clean_config(self):
        config = self.cleaned_data["config"]
        if not isinstance(config, dict):
            raise forms.ValidationError("Expected a JSON object (a RunConfig).")
        return config
