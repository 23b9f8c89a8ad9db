from django import forms

from common.form_errors import DomainErrorForm


class ApiTokenCreateForm(DomainErrorForm):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. 'laptop'.")
