"""The platform's shared web helpers, below every app: errors, pagination, OpenAPI, query parameters, forms, input limits.

``config/`` holds only the project's settings, URLs and entry points; the apps import
these helpers from here, so no arrow runs from an app up to the project.
"""
