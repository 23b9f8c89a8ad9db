"""Every route of the URL configuration, so that tests cover new endpoints without being told."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver
from rest_framework.generics import ListAPIView


@dataclass(frozen=True)
class Route:
    path: str  # as written in the URL configuration, with a leading slash: /api/runs/<int:run_id>/
    pattern: URLPattern
    namespace: str | None  # of the include() it came from, e.g. "admin"

    @property
    def kwargs(self) -> list[str]:
        return list(self.pattern.pattern.converters)

    @property
    def view_class(self):
        return getattr(self.pattern.callback, "view_class", None)


def walk(resolver: URLResolver, prefix: str = "/", namespace: str | None = None) -> Iterator[Route]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from walk(entry, prefix + str(entry.pattern), entry.namespace or namespace)
        else:
            yield Route(path=prefix + str(entry.pattern), pattern=entry, namespace=namespace)


def api_list_routes(resolver: URLResolver) -> list[str]:
    return [
        route.path
        for route in walk(resolver)
        if route.view_class is not None and issubclass(route.view_class, ListAPIView)
    ]
