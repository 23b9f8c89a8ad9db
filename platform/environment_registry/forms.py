"""The dashboard's environment registration form: the REST body, as form fields."""

import json

from django import forms

from common.domain_errors import InvalidInput
from common.form_errors import DomainErrorForm
from common.json_input import json_input_loads

from .models import EnvironmentVersion


class JSONField(forms.CharField):
    """A textarea holding JSON of one type (an object or a list)."""

    def __init__(self, *, json_type: type, **kwargs):
        self.json_type = json_type
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 4, "class": "mono"}))
        super().__init__(**kwargs)

    def clean(self, value):
        value = super().clean(value)
        if not value or not value.strip():
            return self.json_type()
        try:
            parsed = json_input_loads(value)
        except InvalidInput as error:
            raise forms.ValidationError(error.message) from None
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"Not JSON: {error}") from None
        if not isinstance(parsed, self.json_type):
            kind = "an object" if self.json_type is dict else "a list"
            raise forms.ValidationError(f"Must be {kind}.")
        return parsed


class EnvironmentRegisterForm(DomainErrorForm):
    project = forms.ChoiceField()
    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=EnvironmentVersion.Kind.choices)
    entrypoint = forms.CharField(
        max_length=255, required=False, help_text="module:Class, for kind 'python' only."
    )
    settings = JSONField(json_type=dict, required=False, help_text='e.g. {"url": "http://host:8765"}')
    tools = JSONField(
        json_type=list, required=False,
        help_text='[{"name": "calc", "description": "...", "parameters": {"type": "object", ...}}]',
    )
    max_concurrent_episodes = forms.IntegerField(
        required=False, min_value=1, label="Max concurrent episodes",
        help_text="Across every worker; the others wait for a slot. Empty: no limit, unless the server "
        "advertises one.",
    )

    baseline_model = forms.CharField(
        max_length=1000, required=False, label="Baseline model",
        help_text="An imported model's directory (e.g. var/models/smollm2-135m-instruct): the probe then plays 8 "
        "held-out episodes of it and reports how often it calls the tools. Empty: the operator's default, if any.",
    )

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(project.pk, project.name) for project in projects]

    def error_inputs(self) -> dict[str, str]:
        return {**super().error_inputs(), "baseline.model": "baseline_model", "baseline": "baseline_model"}

    def api_body(self) -> dict:
        """The REST registration body, so the page and the API validate alike."""
        body = {key: value for key, value in self.cleaned_data.items() if key != "baseline_model"}
        if self.cleaned_data.get("baseline_model"):
            body["baseline"] = {"model": self.cleaned_data["baseline_model"]}
        return body
