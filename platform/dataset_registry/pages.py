"""The dashboard's dataset pages: the list with an upload form, one dataset's versions and rows, deleting one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from accounts.selectors import project_get_for_user, project_list
from common.domain_errors import DomainError, NotFound

from .forms import DatasetUploadForm
from .models import Dataset, DatasetVersion
from .selectors import dataset_get_for_user, dataset_list, dataset_rows, dataset_version_get
from .services import dataset_upload, dataset_version_delete, version_token_stats_request
from .token_stats import TOKEN_STATS_ROWS, tokenizer_choices

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
            messages.success(request, f"Checked {version}: {version.row_count} rows, now being stored.")
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
    ready = version.status == DatasetVersion.Status.READY
    # Counted once by the datasets worker; until then the page says "computing".
    stats = version_token_stats_request(version=version, tokenizer=tokenizer) if ready else None
    return render(request, "datasets/detail.html", {
        "dataset": dataset,
        "versions": versions,
        "version": version,
        "ready": ready,
        "rows": dataset_rows(version=version)[:ROWS_ON_PAGE] if ready else [],
        "tokenizers": choices,
        "tokenizer": tokenizer,
        "stats": stats,
        "stats_rows_max": TOKEN_STATS_ROWS,
    })


@login_required
@require_http_methods(["POST"])
def dataset_version_delete_page(request, dataset_id: int, number: int):
    try:
        dataset = dataset_get_for_user(user=request.user, dataset_id=dataset_id)
        version = dataset_version_get(dataset=dataset, number=number)
    except NotFound as error:
        raise Http404(str(error)) from None
    try:
        dataset_version_delete(user=request.user, version=version)
    except DomainError as error:
        messages.error(request, error.message)
        return redirect(f"{reverse('dataset-page', args=[dataset_id])}?version={number}")
    messages.success(request, f"Deleted {dataset.name}@{number}.")
    if Dataset.objects.filter(pk=dataset_id).exists():  # the dataset goes with its last version
        return redirect("dataset-page", dataset_id=dataset_id)
    return redirect("dataset-list-page")
