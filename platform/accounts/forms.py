from django import forms


class ApiTokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. 'laptop'.")
