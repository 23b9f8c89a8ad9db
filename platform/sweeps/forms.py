"""The dashboard's new-sweep form: the REST body, as form fields."""

from django import forms

from common.form_errors import DomainErrorForm

from .models import Sweep

SEARCH_SPACE_EXAMPLE = '{"rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": true}}'


class SweepForm(DomainErrorForm):
    project = forms.ChoiceField()
    environment = forms.CharField(max_length=300, help_text="The environment every trial runs: name or name@version.")
    name = forms.CharField(max_length=200, required=False)
    base_config = forms.JSONField(required=False, initial=dict, label="Base config",
                                  widget=forms.Textarea(attrs={"rows": 4}),
                                  help_text="What every trial starts from: a run config, or part of one, as JSON.")
    search_space = forms.JSONField(label="Search space", widget=forms.Textarea(attrs={"rows": 4}),
                                   help_text=f"Config paths and their distributions, e.g. {SEARCH_SPACE_EXAMPLE}; "
                                   'categorical: {"type": "categorical", "choices": [4, 8]}.')
    sampler = forms.ChoiceField(choices=Sweep.Sampler.choices, initial=Sweep.Sampler.TPE)
    pruner = forms.ChoiceField(choices=Sweep.Pruner.choices, initial=Sweep.Pruner.NONE)
    metric = forms.CharField(max_length=200, initial="reward_mean", help_text="The series each trial is judged by.")
    goal = forms.ChoiceField(choices=Sweep.Goal.choices, initial=Sweep.Goal.MAXIMIZE)
    max_runs = forms.IntegerField(min_value=1, initial=8, label="Runs at most")
    concurrency = forms.IntegerField(min_value=1, initial=2, label="Runs at a time")
    seed = forms.IntegerField(initial=0, required=False)

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(project.pk, project.name) for project in projects]

    def service_arguments(self) -> dict:
        data = {key: value for key, value in self.cleaned_data.items() if key != "project"}
        return {**data, "base_config": data["base_config"] or {}, "seed": data["seed"] or 0}
