"""Django's own 404 and 500 answers, in the API's error shape under /api/.

DRF's exception handler covers errors inside API views; these cover what never
reaches one: a path no route matches (``/api/runs/-1/``) and an unhandled error.
Pages keep Django's HTML answers.
"""

from django.http import JsonResponse
from django.views import defaults

from .exception_handler import error_body


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def not_found(request, exception):
    if _is_api(request):
        body = error_body(code="not_found", message=f"No API route matches {request.path}.")
        return JsonResponse(body, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if _is_api(request):
        body = error_body(code="server_error", message="Internal server error; see the server log.")
        return JsonResponse(body, status=500)
    return defaults.server_error(request)
