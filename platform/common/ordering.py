"""``?ordering=`` on list endpoints: only the fields a view names, anything else is a 400.

A view lists what clients may sort by as ``ordering_fields = {"public name": "orm path"}``
and its default as ``ordering = ["-orm_path", ...]``. DRF's own OrderingFilter drops an
unknown field silently, which hides typos; this one names it.
"""

from __future__ import annotations

from rest_framework.filters import OrderingFilter

from common.domain_errors import InvalidInput


class StrictOrderingFilter(OrderingFilter):
    ordering_description = "Comma-separated fields to sort by; prefix a field with '-' to reverse."

    def get_ordering(self, request, queryset, view):
        fields: dict[str, str] | None = getattr(view, "ordering_fields", None)
        default = list(getattr(view, "ordering", None) or [])
        raw = request.query_params.get(self.ordering_param, "")
        terms = [term.strip() for term in raw.split(",") if term.strip()]
        if not fields or not terms:
            return default or None
        ordering = []
        for term in terms:
            name = term.removeprefix("-")
            if name not in fields:
                raise InvalidInput.for_field(
                    self.ordering_param,
                    f"Cannot order by '{name}'; one of {', '.join(sorted(fields))}.",
                )
            ordering.append(("-" if term.startswith("-") else "") + fields[name])
        # A unique last key, so that pages of equal values never overlap or skip.
        if not any(path.removeprefix("-") in {"id", "pk"} for path in ordering):
            ordering.append("-id" if ordering[0].startswith("-") else "id")
        return ordering

    def get_schema_operation_parameters(self, view):
        fields = getattr(view, "ordering_fields", None)
        if not fields:
            return []
        choices = [prefix + name for name in sorted(fields) for prefix in ("", "-")]
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": f"{self.ordering_description} One or more of: {', '.join(choices)}.",
                # An array sent as one comma-separated value: ?ordering=status,-created_at
                "schema": {"type": "array", "items": {"type": "string", "enum": choices}},
                "style": "form",
                "explode": False,
            }
        ]
