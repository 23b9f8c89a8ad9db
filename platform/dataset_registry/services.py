"""Writes of SFT datasets: registering a version from an uploaded file or a file under the dataset roots."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from accounts.models import Project
from accounts.permissions import project_require_writer
from domain_errors import InvalidInput
from tandem.contracts import DatasetRowError, parse_dataset_line
from tandem.dataset_paths import DatasetPathRefused, check_dataset_path

from .models import Dataset, DatasetRow, DatasetVersion

# Names appear in URLs, CLI arguments and run configs, so they stay plain (as environments' do).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Errors listed in one refusal: enough to fix a file in a few rounds, never a page of them.
ROW_ERRORS_SHOWN = 20
# Rows written per INSERT.
ROWS_PER_INSERT = 1000
# Bytes read from a file at a time while it is checked and hashed.
READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class _CheckedFile:
    rows: list[tuple[int, dict]]  # (line, stored row)
    size_bytes: int
    sha256: str


def _chunks(file: IO[bytes]) -> Iterator[bytes]:
    while chunk := file.read(READ_CHUNK_BYTES):
        yield chunk


def _check_file(chunks: Iterable[bytes], *, field: str) -> _CheckedFile:
    """Every row of a JSONL file checked before anything is stored; raises InvalidInput naming each bad line.

    The file is read in chunks and refused as soon as it passes TANDEM_DATASET_MAX_BYTES.
    """
    cap = settings.TANDEM_DATASET_MAX_BYTES
    digest, size, pending = hashlib.sha256(), 0, b""
    rows: list[tuple[int, dict]] = []
    errors: list[str] = []
    line_number = 0

    def take(raw: bytes) -> None:
        nonlocal line_number
        line_number += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            errors.append(str(DatasetRowError(line=line_number, field="", message=f"not UTF-8 ({error.reason})")))
            return
        if not text.strip():
            return  # a blank line (the file's last newline, say) is no row
        try:
            rows.append((line_number, parse_dataset_line(text, line=line_number).stored()))
        except DatasetRowError as error:
            errors.append(str(error))

    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise InvalidInput.for_field(field, (
                f"The file is larger than this deployment's cap of {cap} bytes (TANDEM_DATASET_MAX_BYTES); "
                "split it, or ask the operator to raise the cap."))
        digest.update(chunk)
        *complete, pending = (pending + chunk).split(b"\n")
        for raw in complete:
            take(raw)
    if pending:
        take(pending)
    if errors:
        more = f" (and {len(errors) - ROW_ERRORS_SHOWN} more)" if len(errors) > ROW_ERRORS_SHOWN else ""
        shown = errors[:ROW_ERRORS_SHOWN]
        raise InvalidInput(f"{field}: {shown[0]}{more}; nothing was stored.", fields={field: shown})
    if not rows:
        raise InvalidInput.for_field(field, "The file has no rows: one JSON conversation a line.")
    return _CheckedFile(rows=rows, size_bytes=size, sha256=digest.hexdigest())


def _validate_name(name: str) -> None:
    if not NAME_PATTERN.match(name) or len(name) > Dataset._meta.get_field("name").max_length:
        raise InvalidInput.for_field(
            "name", "Use at most 100 letters, digits, '_', '.' and '-', starting with a letter or digit.")


@transaction.atomic
def _version_store(*, user: AbstractBaseUser, project: Project, name: str, checked: _CheckedFile,
                   source: str, source_name: str) -> DatasetVersion:
    dataset, _ = Dataset.objects.get_or_create(project=project, name=name)
    # The row lock numbers concurrent uploads of one name one after the other.
    Dataset.objects.select_for_update().get(pk=dataset.pk)
    latest = dataset.versions.order_by("-number").values_list("number", flat=True).first() or 0
    roles = Counter(message["role"] for _, row in checked.rows for message in row["messages"])
    version = DatasetVersion.objects.create(
        dataset=dataset, number=latest + 1, source=source, source_name=source_name[:255],
        size_bytes=checked.size_bytes, sha256=checked.sha256, row_count=len(checked.rows),
        message_count=sum(roles.values()), role_counts=dict(sorted(roles.items())),
        created_by=user if user.is_authenticated else None,
    )
    DatasetRow.objects.bulk_create(
        (DatasetRow(version=version, index=index, line=line, messages=row["messages"], metadata=row["metadata"])
         for index, (line, row) in enumerate(checked.rows)),
        batch_size=ROWS_PER_INSERT,
    )
    return version


def dataset_upload(*, user: AbstractBaseUser, project: Project, name: str, file: IO[bytes],
                   file_name: str) -> DatasetVersion:
    """Register ``file`` (JSONL, one conversation a line) as the next version of ``name`` in ``project``.

    A name new in the project starts at version 1. Every row is checked first
    and the version stored in one transaction, so a file with any bad row
    stores nothing; the refusal names each bad line and field (``file``).
    """
    project_require_writer(user=user, project=project)
    _validate_name(name)
    checked = _check_file(_chunks(file), field="file")
    return _version_store(user=user, project=project, name=name, checked=checked,
                          source=DatasetVersion.Source.UPLOAD, source_name=file_name or "upload.jsonl")


def dataset_read_path(*, user: AbstractBaseUser, project: Project, name: str, path: str) -> DatasetVersion:
    """Like :func:`dataset_upload`, from a file on the platform's host under the operator's dataset roots."""
    project_require_writer(user=user, project=project)
    _validate_name(name)
    try:
        resolved = check_dataset_path(path, roots=settings.TANDEM_DATASET_ROOTS,
                                      refused_root=settings.TANDEM_CHECKPOINT_ROOT)
    except DatasetPathRefused as error:
        raise InvalidInput.for_field("path", str(error)) from None
    with resolved.open("rb") as file:
        checked = _check_file(_chunks(file), field="path")
    return _version_store(user=user, project=project, name=name, checked=checked,
                          source=DatasetVersion.Source.PATH, source_name=str(resolved))
