"""Streaming a dataset upload to disk under the operator's cap (TANDEM_DATASET_MAX_BYTES).

Django's own handlers would read any size of upload into a temporary file
before the view sees it; this one refuses a request that says it is too large
before reading its body, and one that turns out too large as soon as it has
read past the cap, with a 413 that names the cap.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, TemporaryFileUploadHandler
from rest_framework import status
from rest_framework.exceptions import APIException

# Room for the form's other fields and the multipart boundaries around the file.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class DatasetTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"

    def __init__(self, cap: int):
        super().__init__(f"file: a dataset may be at most {cap} bytes on this deployment "
                         "(TANDEM_DATASET_MAX_BYTES); split it, or ask the operator to raise the cap.")


class CappedUploadHandler(FileUploadHandler):
    """Counts the file's bytes as they arrive and passes them on to the next handler."""

    def __init__(self, request=None):
        super().__init__(request)
        self.cap = settings.TANDEM_DATASET_MAX_BYTES
        self.received = 0

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        if content_length and content_length > self.cap + MULTIPART_OVERHEAD_BYTES:
            raise DatasetTooLarge(self.cap)

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > self.cap:
            raise DatasetTooLarge(self.cap)
        return raw_data

    def file_complete(self, file_size):
        return None  # the next handler (a temporary file) keeps it


def capped_upload_handlers(request) -> list[FileUploadHandler]:
    """The handlers of a dataset upload: the cap, then a temporary file (never the memory)."""
    return [CappedUploadHandler(request), TemporaryFileUploadHandler(request)]
