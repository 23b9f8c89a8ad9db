"""The dashboard's report form: the REST body, as form fields."""

from django import forms

from common.form_errors import DomainErrorForm


class ReportForm(DomainErrorForm):
    title = forms.CharField(max_length=200)
    body = forms.CharField(required=False, strip=False, widget=forms.Textarea(attrs={"rows": 18}), help_text=(
        "Markdown. A line {{view: <name>}} embeds that saved view's panels, live."))
