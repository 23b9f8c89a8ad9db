"""The API's OpenAPI schema (drf-spectacular): the one error shape and token auth.

Every operation documents its errors with :class:`ErrorSerializer`, added here
rather than on each view, so a new view cannot forget them: 401 and 403 for
authenticated operations, 400 where input is read, 404 where the path, a
project parameter or a page number names something that may not exist. Views
add what else they answer (409) with ``extend_schema``.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance
from rest_framework import serializers
from rest_framework.permissions import AllowAny


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable: invalid, not_found ...")
    message = serializers.CharField(help_text="For people; names the field or the object.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Dotted field path to its messages, e.g. config.rollout.group_size; empty unless 400.",
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


ERROR_DESCRIPTIONS = {
    "400": "Invalid input; `fields` names each bad field or query parameter.",
    "401": "No credentials, or a token that is invalid or revoked.",
    "403": "Authenticated, but the role (or CSRF token) does not allow this.",
    "404": "Missing, or not visible to the caller (or a page past the last).",
    "409": "Conflicts with the object's current state.",
}


class TandemAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    ErrorSerializer, code, direction=direction
                )
                responses[code]["description"] = ERROR_DESCRIPTIONS[code]
        return responses

    def _error_codes(self) -> list[str]:
        codes = []
        reads_input = self.method in {"POST", "PUT", "PATCH"} or bool(
            self._get_filter_parameters() or self._get_pagination_parameters()
        )
        if reads_input or getattr(self.view, "reads_query_parameters", False):
            codes.append("400")
        if not all(isinstance(p, AllowAny) for p in self.view.get_permissions()):
            codes += ["401", "403"]
        if "{" in self.path or self._names_a_project() or self._get_pagination_parameters():
            codes.append("404")
        if self.path.startswith("/api/trainer/runs/"):
            # Every trainer route of a run takes it only from the trainer holding it
            # (TrainerConflictCode: run_held_by_another_trainer, run_not_claimed).
            codes.append("409")
        return codes

    def _names_a_project(self) -> bool:
        """``?project=`` or a body's ``project``: another's project is reported missing."""
        if any(p["name"] == "project" for p in self._get_filter_parameters()):
            return True
        if self.method not in {"POST", "PUT", "PATCH"}:
            return False
        serializer = force_instance(self.get_request_serializer())
        return "project" in getattr(serializer, "fields", {})


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <value>`; make tokens at /tokens/ or POST /api/tokens/.",
        }
