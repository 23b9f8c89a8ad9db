"""Django REST framework: token auth for scripts and the trainer, session auth for the browser.

Also the API's OpenAPI schema (drf-spectacular).
"""

from .env_vars import env_str

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so unauthenticated API calls get 401 with a WWW-Authenticate header, not 403.
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        # DRF's, writing a lone surrogate (a model's text, read back exactly) as JSON escapes it.
        "common.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    # DRF's, refusing what cannot be stored (NUL, lone surrogates, NaN, 1e400) or nests too deep,
    # with a 400 naming the field (common/json_input.py).
    "DEFAULT_PARSER_CLASSES": ["common.json_input.StrictJSONParser"],
    # Every error, ours or DRF's, leaves the API in one shape: {"error": {code, message, fields}}.
    "EXCEPTION_HANDLER": "common.exception_handler.api_exception_handler",
    # Only views that ask for a scope are throttled (accounts.views: minting API tokens).
    "DEFAULT_THROTTLE_RATES": {"token-create": env_str("TANDEM_TOKEN_CREATE_RATE", "30/hour")},
    "DEFAULT_PAGINATION_CLASS": "common.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    # Every list endpoint: its FilterSet's filters, then ?ordering= over the fields the view names.
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "common.ordering.StrictOrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "common.openapi.TandemAutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tandem API",
    "DESCRIPTION": (
        "Runs, environments, projects and tokens of a Tandem platform. Every error has "
        'one shape: `{"error": {"code", "message", "fields"}}`.'
    ),
    "VERSION": "1",
    # The schema describes the API, not the server's own schema endpoints.
    "SERVE_INCLUDE_SCHEMA": False,
    # After the enum naming: each operation's summary and own description (common/operation_docs.py),
    # and no trainer routes in the schema of someone who is not a trainer.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "common.operation_docs.describe_operations",
        "accounts.openapi_hooks.hide_trainer_operations",
    ],
    # Swagger UI's assets come from the drf-spectacular-sidecar package: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Separate request and response components, so read-only fields (id, created_at)
    # are not asked of clients and write-only ones are not promised back.
    "COMPONENT_SPLIT_REQUEST": True,
    # Three models have a `status`; each choice set gets a name of its own.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.models.Run.Status",
        "EnvironmentVersionStatusEnum": "environment_registry.models.EnvironmentVersion.Status",
        "EnvironmentProbeStatusEnum": "environment_registry.models.EnvironmentProbe.Status",
        "TrajectoryStatusEnum": "trajectories.models.TrajectorySample.Status",
        # Two fields named "purpose": an environment probe's and a trajectory sample's.
        "EnvironmentProbePurposeEnum": "environment_registry.models.EnvironmentProbe.Purpose",
        "TrajectoryPurposeEnum": "trajectories.models.SAMPLE_PURPOSE_CHOICES",
        # Two fields named "role": a project member's and a Tandem process's.
        "RoleEnum": "accounts.models.Membership.Role",
        "ProcessRoleEnum": "telemetry.serializers.PROCESS_ROLES",
        # Three fields named "kind": an environment version's, an evaluation's and an alert rule's.
        "EnvironmentKindEnum": "environment_registry.models.EnvironmentVersion.Kind",
        "EvaluationKindEnum": "tandem.contracts.EVALUATION_KINDS",
        "AlertRuleKindEnum": "alerts.models.AlertRule.Kind",
    },
}
