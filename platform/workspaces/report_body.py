"""A report's markdown, rendered: text as CommonMark with raw HTML escaped (a report is read by every member
of its project, so what one writes never runs in another's browser), and each line ``{{view: <name>}}`` as
a block of that saved view's live panels."""

from __future__ import annotations

import re
from dataclasses import dataclass

from markdown_it import MarkdownIt

from accounts.models import Project

from .selectors import saved_views_by_name

VIEW_EMBED = re.compile(r"^[ \t]*\{\{\s*view:\s*(?P<name>[^{}\n]+?)\s*\}\}[ \t]*$", re.MULTILINE)
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


@dataclass(frozen=True)
class ReportBlock:
    html: str = ""  # rendered markdown (safe), when the block is text
    view_name: str = ""  # the embedded view's name, when the block is a view
    view_id: int | None = None  # None: no view of that name in the report's project
    view_query: str = ""


def report_blocks(*, project: Project, body: str) -> list[ReportBlock]:
    """The report's blocks in order: text, and the views it embeds, looked up in its own project only."""
    views = _embedded_views(project=project, body=body)
    blocks, start = [], 0
    for match in VIEW_EMBED.finditer(body):
        text = body[start:match.start()]
        if text.strip():
            blocks.append(ReportBlock(html=_MARKDOWN.render(text)))
        blocks.append(_view_block(match["name"], views))
        start = match.end()
    if body[start:].strip():
        blocks.append(ReportBlock(html=_MARKDOWN.render(body[start:])))
    return blocks


def report_views(*, project: Project, body: str) -> list[ReportBlock]:
    """The views the report embeds, in order, as report_blocks finds them, without rendering its text."""
    views = _embedded_views(project=project, body=body)
    return [_view_block(match["name"], views) for match in VIEW_EMBED.finditer(body)]


def _embedded_views(*, project: Project, body: str) -> dict:
    return saved_views_by_name(project=project, names=[match["name"] for match in VIEW_EMBED.finditer(body)])


def _view_block(name: str, views: dict) -> ReportBlock:
    view = views.get(name)
    return ReportBlock(view_name=name, view_id=view.pk if view else None, view_query=view.query if view else "")
