"""Writes of SFT datasets: registering a version, storing its rows, token statistics, deleting a version.

A registration is two steps. The web process checks the file line by line as it
copies it under the media root (no row is kept in memory, and checking stops at
the errors a refusal shows), and records the version as ``pending``; the
datasets worker (queue ``platform-datasets``) then reads the kept file and
stores its rows in transactions of ROWS_PER_TRANSACTION, recording how many it
has stored, and the version is ``ready``, or ``failed`` with its reason.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from accounts.models import Project
from accounts.permissions import project_require_writer
from common.domain_errors import Conflict, InvalidInput
from tandem.allowlists.dataset_paths import DatasetPathRefused, check_dataset_path
from tandem.contracts import DatasetRowError, parse_dataset_line

from .models import Dataset, DatasetRow, DatasetTokenStats, DatasetVersion

logger = logging.getLogger(__name__)

# Names appear in URLs, CLI arguments and run configs, so they stay plain (as environments' do).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Errors listed in one refusal, and where checking stops: enough to fix a file in a few rounds,
# and a file of bad lines costs no more than its first bad ones.
ROW_ERRORS_SHOWN = 20
# Rows the worker commits per transaction: other writers never wait long behind one.
ROWS_PER_TRANSACTION = 1000
# Bytes read from a file at a time while it is checked, hashed and kept.
READ_CHUNK_BYTES = 1 << 20
# Where kept files wait for the worker, under MEDIA_ROOT.
KEPT_FILES_DIR = "dataset-uploads"
# Versions a run may not train on yet, and versions counted as a user's upload in progress.
UNFINISHED_STATUSES = (DatasetVersion.Status.CHECKING, DatasetVersion.Status.PENDING, DatasetVersion.Status.STORING)

# Who still uses a version, asked before it is deleted: each callable takes (version=) and returns
# a description of each user ("run 12 (running)"). runs/apps.py registers the runs that have not
# ended and pin it: runs pin datasets, and datasets' domain imports nothing of runs.
VERSION_USERS: list[Callable[..., list[str]]] = []


@dataclass
class _CheckedFile:
    size_bytes: int = 0
    row_count: int = 0
    roles: Counter = field(default_factory=Counter)
    sha256: str = ""


def _chunks(file: IO[bytes]) -> Iterator[bytes]:
    while chunk := file.read(READ_CHUNK_BYTES):
        yield chunk


def _lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, raw line)`` of a file read in chunks."""
    pending, line_number = b"", 0
    for chunk in chunks:
        *complete, pending = (pending + chunk).split(b"\n")
        for raw in complete:
            line_number += 1
            yield line_number, raw
    if pending:
        yield line_number + 1, pending


def _decoded(raw: bytes) -> str:
    # surrogateescape: an invalid byte inside a string is named by its field (parse_dataset_line).
    return raw.decode("utf-8", errors="surrogateescape")


def _parse(raw: bytes, *, line: int) -> dict | None:
    """The stored row of one raw line, None for a blank one; raises DatasetRowError."""
    text = _decoded(raw)
    if not text.strip():
        return None  # a blank line (the file's last newline, say) is no row
    return parse_dataset_line(text, line=line).stored()


def _check_and_keep(file: IO[bytes], *, field: str, kept: Path) -> _CheckedFile:
    """Check every line of ``file`` while copying it to ``kept``; raises InvalidInput naming bad lines.

    Nothing of a row is kept in memory. At the ROW_ERRORS_SHOWN-th bad line,
    reading stops: the refusal lists those, and the file is read no further.
    """
    cap = settings.TANDEM_DATASET_MAX_BYTES
    checked, digest = _CheckedFile(), hashlib.sha256()
    errors: list[str] = []

    def counted(chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            checked.size_bytes += len(chunk)
            if checked.size_bytes > cap:
                raise InvalidInput.for_field(field, (
                    f"The file is larger than this deployment's cap of {cap} bytes (TANDEM_DATASET_MAX_BYTES); "
                    "split it, or ask the operator to raise the cap."))
            digest.update(chunk)
            out.write(chunk)
            yield chunk

    with kept.open("wb") as out:
        for line, raw in _lines(counted(_chunks(file))):
            try:
                row = _parse(raw, line=line)
            except DatasetRowError as error:
                errors.append(str(error))
                if len(errors) == ROW_ERRORS_SHOWN:
                    break
                continue
            if row is not None:
                checked.row_count += 1
                checked.roles.update(message["role"] for message in row["messages"])
    if errors:
        more = (f" (checking stopped at the {ROW_ERRORS_SHOWN}th bad line; later lines were not read)"
                if len(errors) == ROW_ERRORS_SHOWN else "")
        raise InvalidInput(f"{field}: {errors[0]}{more}; nothing was stored.", fields={field: errors})
    if not checked.row_count:
        raise InvalidInput.for_field(field, "The file has no rows: one JSON conversation a line.")
    checked.sha256 = digest.hexdigest()
    return checked


def _validate_name(name: str) -> None:
    if not NAME_PATTERN.match(name) or len(name) > Dataset._meta.get_field("name").max_length:
        raise InvalidInput.for_field(
            "name", "Use at most 100 letters, digits, '_', '.' and '-', starting with a letter or digit.")


def _kept_path(version: DatasetVersion) -> Path:
    return Path(settings.MEDIA_ROOT) / version.kept_file


def _check_quota(*, project: Project, size_bytes: int, field: str) -> None:
    """Refuse a new version of ``size_bytes`` past the project's quota, naming the setting."""
    counted = DatasetVersion.objects.filter(dataset__project=project).exclude(status=DatasetVersion.Status.FAILED)
    versions_cap = settings.TANDEM_DATASET_PROJECT_MAX_VERSIONS
    if counted.count() >= versions_cap:
        raise InvalidInput.for_field("name", (
            f"Project '{project.name}' has {versions_cap} dataset versions, its quota on this deployment "
            "(TANDEM_DATASET_PROJECT_MAX_VERSIONS); delete versions no run needs, or ask the operator."))
    bytes_cap = settings.TANDEM_DATASET_PROJECT_MAX_BYTES
    used = counted.aggregate(total=Sum("size_bytes"))["total"] or 0
    if used + size_bytes > bytes_cap:
        raise InvalidInput.for_field(field, (
            f"Project '{project.name}' holds {used} bytes of datasets; {size_bytes} more would pass its quota of "
            f"{bytes_cap} bytes on this deployment (TANDEM_DATASET_PROJECT_MAX_BYTES); delete versions no run "
            "needs, or ask the operator."))


def _upload_in_progress(user: AbstractBaseUser) -> DatasetVersion | None:
    return (DatasetVersion.objects.select_related("dataset").filter(created_by=user, status__in=UNFINISHED_STATUSES)
            .first())


def _refuse_second_upload(version: DatasetVersion) -> Conflict:
    return Conflict(
        f"You have an upload in progress: {version.dataset.name}@{version.number} is {version.status} "
        f"({version.rows_stored} of {version.row_count} rows stored). One upload per user at a time: wait "
        "for it to be ready or failed, then upload again.", fields={"file": ["Another upload of yours is in progress."]})


@transaction.atomic
def _version_begin(*, user: AbstractBaseUser, project: Project, name: str, size_bytes: int, field: str,
                   source: str, source_name: str) -> DatasetVersion:
    """The next version of ``name``, ``checking``: it numbers the version and holds the user's one upload."""
    # The project's row lock: the quota and version numbers of concurrent uploads count one after the other.
    Project.objects.select_for_update().get(pk=project.pk)
    # A check whose web process died never finished: it no longer holds its user's upload.
    DatasetVersion.objects.filter(
        created_by=user, status=DatasetVersion.Status.CHECKING,
        updated_at__lt=timezone.now() - timedelta(seconds=settings.TANDEM_DATASET_CHECK_ABANDONED_S),
    ).update(status=DatasetVersion.Status.FAILED, failure_reason="The check of the file was interrupted.")
    in_progress = _upload_in_progress(user)
    if in_progress is not None:
        raise _refuse_second_upload(in_progress)
    _check_quota(project=project, size_bytes=size_bytes, field=field)
    dataset, _ = Dataset.objects.get_or_create(project=project, name=name)
    latest = dataset.versions.order_by("-number").values_list("number", flat=True).first() or 0
    try:
        with transaction.atomic():
            return DatasetVersion.objects.create(
                dataset=dataset, number=latest + 1, source=source, source_name=source_name[:255],
                size_bytes=size_bytes, sha256="", row_count=0, message_count=0,
                status=DatasetVersion.Status.CHECKING, created_by=user,
            )
    except IntegrityError:
        # Another request of the same user began between the check above and this insert.
        raise _refuse_second_upload(_upload_in_progress(user) or DatasetVersion(
            dataset=dataset, number=latest + 1, status=DatasetVersion.Status.CHECKING)) from None


@transaction.atomic
def _version_abandon(*, version_id: int) -> None:
    """Forget a version whose file was refused: it stored nothing, and a name it created goes too."""
    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    if version is None:
        return
    dataset = version.dataset
    version.delete()
    if not dataset.versions.exists():
        dataset.delete()


@transaction.atomic
def _version_accept(*, version_id: int, checked: _CheckedFile, kept_file: str) -> DatasetVersion:
    roles = checked.roles
    DatasetVersion.objects.filter(pk=version_id).update(
        status=DatasetVersion.Status.PENDING, size_bytes=checked.size_bytes, sha256=checked.sha256,
        row_count=checked.row_count, message_count=sum(roles.values()), role_counts=dict(sorted(roles.items())),
        kept_file=kept_file, updated_at=timezone.now(),
    )
    from .tasks import store_dataset_version  # tasks import this module

    transaction.on_commit(lambda: store_dataset_version.delay(version_id))
    return DatasetVersion.objects.select_related("dataset").get(pk=version_id)


def _register(*, user: AbstractBaseUser, project: Project, name: str, file: IO[bytes], size_bytes: int,
              field: str, source: str, source_name: str) -> DatasetVersion:
    project_require_writer(user=user, project=project)
    _validate_name(name)
    if size_bytes > settings.TANDEM_DATASET_MAX_BYTES:
        raise InvalidInput.for_field(field, (
            f"The file is larger than this deployment's cap of {settings.TANDEM_DATASET_MAX_BYTES} bytes "
            "(TANDEM_DATASET_MAX_BYTES); split it, or ask the operator to raise the cap."))
    version = _version_begin(user=user, project=project, name=name, size_bytes=size_bytes, field=field,
                             source=source, source_name=source_name)
    kept_file = f"{KEPT_FILES_DIR}/{version.pk}.jsonl"
    kept = Path(settings.MEDIA_ROOT) / kept_file
    kept.parent.mkdir(parents=True, exist_ok=True)
    try:
        checked = _check_and_keep(file, field=field, kept=kept)
    except BaseException:
        kept.unlink(missing_ok=True)
        _version_abandon(version_id=version.pk)
        raise
    return _version_accept(version_id=version.pk, checked=checked, kept_file=kept_file)


def dataset_upload(*, user: AbstractBaseUser, project: Project, name: str, file: IO[bytes],
                   file_name: str) -> DatasetVersion:
    """Register ``file`` (JSONL, one conversation a line) as the next version of ``name`` in ``project``.

    A name new in the project starts at version 1. Every row is checked first
    (a file with any bad row stores nothing; the refusal names each bad line and
    field, ``file``), then the version is ``pending`` until the datasets worker
    has stored its rows. One upload per user at a time (Conflict), within the
    project's quota (InvalidInput naming the setting).
    """
    size = getattr(file, "size", None)  # an UploadedFile's; else a file object's own end
    if size is None:
        size = file.seek(0, os.SEEK_END)
        file.seek(0)
    return _register(user=user, project=project, name=name, file=file, size_bytes=size, field="file",
                     source=DatasetVersion.Source.UPLOAD, source_name=file_name or "upload.jsonl")


def dataset_read_path(*, user: AbstractBaseUser, project: Project, name: str, path: str) -> DatasetVersion:
    """Like :func:`dataset_upload`, from a file on the platform's host under the operator's dataset roots."""
    project_require_writer(user=user, project=project)
    try:
        resolved = check_dataset_path(path, roots=settings.TANDEM_DATASET_ROOTS,
                                      refused_root=settings.TANDEM_CHECKPOINT_ROOT)
    except DatasetPathRefused as error:
        raise InvalidInput.for_field("path", str(error)) from None
    with resolved.open("rb") as file:
        return _register(user=user, project=project, name=name, file=file, size_bytes=os.fstat(file.fileno()).st_size,
                         field="path", source=DatasetVersion.Source.PATH, source_name=str(resolved))


# -- the datasets worker's side --------------------------------------------------------------

def _stored_rows(kept: Path, *, skip: int) -> Iterator[tuple[int, int, dict]]:
    """``(index, line, stored row)`` of the kept file's rows from index ``skip`` on."""
    index = 0
    with kept.open("rb") as file:
        for line, raw in _lines(_chunks(file)):
            if index < skip:
                if _decoded(raw).strip():
                    index += 1
                continue
            row = _parse(raw, line=line)
            if row is not None:
                yield index, line, row
                index += 1


def _store_batch(*, version_id: int, batch: list[tuple[int, int, dict]]) -> bool:
    """One transaction of rows and the progress they make; False once the version is gone."""
    with transaction.atomic():
        if not DatasetVersion.objects.select_for_update().filter(pk=version_id).exists():
            return False
        DatasetRow.objects.bulk_create(
            DatasetRow(version_id=version_id, index=index, line=line, messages=row["messages"],
                       metadata=row["metadata"]) for index, line, row in batch)
        DatasetVersion.objects.filter(pk=version_id).update(rows_stored=batch[-1][0] + 1, updated_at=timezone.now())
    return True


def dataset_version_store(*, version_id: int) -> None:
    """Store the rows of a ``pending`` version from its kept file, ROWS_PER_TRANSACTION at a time.

    Run by the datasets worker; run again after the worker was lost, it goes on
    from the rows already stored. Any failure fails the version with its reason
    and removes what it had stored.
    """
    updated = DatasetVersion.objects.filter(
        pk=version_id, status__in=(DatasetVersion.Status.PENDING, DatasetVersion.Status.STORING),
    ).update(status=DatasetVersion.Status.STORING, updated_at=timezone.now())
    if not updated:
        return  # deleted, or stored already
    version = DatasetVersion.objects.get(pk=version_id)
    kept = _kept_path(version)
    try:
        batch: list[tuple[int, int, dict]] = []
        for item in _stored_rows(kept, skip=version.rows_stored):
            batch.append(item)
            if len(batch) == ROWS_PER_TRANSACTION:
                if not _store_batch(version_id=version_id, batch=batch):
                    return
                batch = []
        if batch and not _store_batch(version_id=version_id, batch=batch):
            return
    except Exception as error:
        dataset_version_fail(version_id=version_id, reason=f"Storing the rows failed: {error}"[:2000])
        raise
    stored = DatasetVersion.objects.filter(pk=version_id).update(
        status=DatasetVersion.Status.READY, kept_file="", updated_at=timezone.now())
    kept.unlink(missing_ok=True)
    if stored:
        # The byte counts every page shows first, computed now rather than on a first view.
        version_token_stats_request(version=DatasetVersion.objects.get(pk=version_id), tokenizer="byte")


def dataset_version_fail(*, version_id: int, reason: str) -> None:
    """Mark a version failed with ``reason``; its stored rows and kept file are removed."""
    with transaction.atomic():
        version = DatasetVersion.objects.select_for_update().filter(pk=version_id).first()
        if version is None:
            return
        DatasetRow.objects.filter(version_id=version_id).delete()
        kept = version.kept_file
        DatasetVersion.objects.filter(pk=version_id).update(
            status=DatasetVersion.Status.FAILED, failure_reason=reason, rows_stored=0, kept_file="",
            updated_at=timezone.now())
    if kept:
        (Path(settings.MEDIA_ROOT) / kept).unlink(missing_ok=True)
    logger.warning("dataset version %s failed: %s", version_id, reason)


# -- token statistics --------------------------------------------------------------------------

def version_token_stats_request(*, version: DatasetVersion, tokenizer: str) -> DatasetTokenStats:
    """The version's statistics under ``tokenizer``: stored, or now asked of the datasets worker once."""
    stats, created = DatasetTokenStats.objects.get_or_create(version=version, tokenizer=tokenizer)
    if created:
        from .tasks import compute_token_stats

        transaction.on_commit(lambda: compute_token_stats.delay(stats.pk))
    return stats


def version_token_stats_compute(*, stats_id: int) -> None:
    """Count the tokens of a ``computing`` DatasetTokenStats and store them (the datasets worker's job)."""
    from .token_stats import version_token_counts

    stats = DatasetTokenStats.objects.select_related("version").filter(
        pk=stats_id, status=DatasetTokenStats.Status.COMPUTING).first()
    if stats is None:
        return
    try:
        counts = version_token_counts(version=stats.version, tokenizer=stats.tokenizer)
    except Exception as error:
        DatasetTokenStats.objects.filter(pk=stats_id).update(
            status=DatasetTokenStats.Status.FAILED, failure_reason=str(error)[:2000], computed_at=timezone.now())
        raise
    DatasetTokenStats.objects.filter(pk=stats_id).update(
        status=DatasetTokenStats.Status.READY, rows=counts.rows, tokens=counts.tokens,
        assistant_tokens=counts.assistant_tokens, mean_tokens_per_row=counts.mean_tokens_per_row,
        max_tokens_per_row=counts.max_tokens_per_row, computed_at=timezone.now())


# -- deleting ---------------------------------------------------------------------------------

def dataset_version_delete(*, user: AbstractBaseUser, version: DatasetVersion) -> None:
    """Delete a version and its rows (the dataset too, with its last version).

    Raises:
      Conflict: while something uses the version (VERSION_USERS: a run that has not ended
        pins it); it names them.
    """
    project_require_writer(user=user, project=version.dataset.project)
    with transaction.atomic():
        # The row lock run creation also takes to pin a version: no run pins it meanwhile.
        DatasetVersion.objects.select_for_update().filter(pk=version.pk).first()
        users = [user for find_users in VERSION_USERS for user in find_users(version=version)]
        if users:
            named = ", ".join(users[:10])
            raise Conflict(f"{version} is used by {named}. Cancel or wait for them to end, then delete it.",
                           fields={"version": [f"Used by {named}."]})
        kept, dataset = version.kept_file, version.dataset
        version.delete()
        if not dataset.versions.exists():
            dataset.delete()
    if kept:
        (Path(settings.MEDIA_ROOT) / kept).unlink(missing_ok=True)
