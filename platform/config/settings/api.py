"""Django REST framework: token auth for scripts and the trainer, session auth for the browser."""

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so unauthenticated API calls get 401 with a WWW-Authenticate header, not 403.
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    # Every error, ours or DRF's, leaves the API in one shape: {"error": {code, message, fields}}.
    "EXCEPTION_HANDLER": "config.exception_handler.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "config.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
}
