"""The dashboard's dataset pages: the list with an upload form, and one dataset's versions and rows."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from accounts.selectors import project_get_for_user, project_list
from domain_errors import DomainError, NotFound

from .forms import DatasetUploadForm
from .selectors import dataset_get_for_user, dataset_list, dataset_rows, dataset_version_get
from .services import dataset_upload
from .token_stats import TOKEN_STATS_ROWS, tokenizer_choices, version_token_stats

# Rows shown as conversations on a version's page.
ROWS_ON_PAGE = 5


@login_required
@require_http_methods(["GET", "POST"])
def dataset_list_page(request):
    form = DatasetUploadForm(request.POST or None, request.FILES or None, projects=project_list(user=request.user))
    if request.method == "POST" and form.is_valid():
        try:
            project = project_get_for_user(user=request.user, project_id=int(form.cleaned_data["project"]))
            upload = form.cleaned_data["file"]
            version = dataset_upload(user=request.user, project=project, name=form.cleaned_data["name"],
                                     file=upload, file_name=upload.name)
        except DomainError as error:
            for field, errors in (error.fields or {"file": [error.message]}).items():
                for message in errors:
                    form.add_error(field if field in form.fields else None, message)
        else:
            messages.success(request, f"Registered {version}: {version.row_count} rows.")
            return redirect("dataset-page", dataset_id=version.dataset_id)
    return render(request, "datasets/list.html", {"datasets": dataset_list(user=request.user), "form": form})


@login_required
def dataset_page(request, dataset_id: int):
    try:
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        versions = list(dataset.versions.all())
        number = int(request.GET.get("version") or (versions[0].number if versions else 0))
        version = dataset_version_get(dataset=dataset, number=number)
    except (NotFound, ValueError) as error:
        raise Http404(str(error)) from None
    choices = tokenizer_choices()
    tokenizer = request.GET.get("tokenizer", "byte")
    if tokenizer not in dict(choices):
        tokenizer = "byte"
    return render(request, "datasets/detail.html", {
        "dataset": dataset,
        "versions": versions,
        "version": version,
        "rows": dataset_rows(version=version)[:ROWS_ON_PAGE],
        "tokenizers": choices,
        "tokenizer": tokenizer,
        "stats": version_token_stats(version=version, tokenizer=tokenizer),
        "stats_rows_max": TOKEN_STATS_ROWS,
    })
