from django import forms


class DatasetUploadForm(forms.Form):
    project = forms.ChoiceField()
    name = forms.CharField(max_length=100, help_text="A new name starts at version 1; an existing one gets its next version.")
    file = forms.FileField(help_text="JSONL: one {\"messages\": [...]} conversation a line.")

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(project.pk, project.name) for project in projects]
