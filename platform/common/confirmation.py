"""Destructive actions of the dashboard ask first, with JavaScript or without.

A destructive form (``data-confirm`` on it) posts to its view. With JavaScript,
tandem/confirm.js asks with the browser's dialog and, once the user agrees, sends
``confirmed=yes`` along. Without it, the first post comes without the field, and
the view answers with a page that asks (:func:`confirmation_page`), whose button
posts again with the field. Nothing is changed by a post that was not confirmed.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

CONFIRMED_FIELD = "confirmed"


def action_confirmed(request: HttpRequest) -> bool:
    return request.POST.get(CONFIRMED_FIELD) == "yes"


def confirmation_page(request: HttpRequest, *, question: str, consequence: str, confirm_label: str,
                      back_url: str) -> HttpResponse:
    """The page that asks before the action of ``request.path`` is taken."""
    return render(request, "confirm.html", {
        "question": question, "consequence": consequence, "confirm_label": confirm_label,
        "back_url": back_url, "action_url": request.path, "confirmed_field": CONFIRMED_FIELD,
    })
