"""The new-run form's tree bound to what its inputs hold and the errors about them, for the template.

Errors are keyed by dotted path (``rl_steps``, ``sft.datasets.0.weight``, a
section's ``model``), as ``config_from_form`` and the run services name them.
Every error is also listed in document order, naming its field, for the
summary above the form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config_form import ROW_INDEX, ConfigField, ConfigForm, ConfigSection, FormState, input_id


@dataclass
class BoundRow:
    index: int | str  # ROW_INDEX in the template the page copies for a new row
    cells: list[BoundInput]


@dataclass
class BoundInput:
    """One input as rendered: its field, name and id, text, errors, and a rows widget's rows."""

    field: ConfigField
    path: str
    value: str
    errors: list[str]
    rows: list[BoundRow] = field(default_factory=list)
    new_row: BoundRow | None = None
    is_section = False

    @property
    def input_name(self) -> str:
        return "config." + self.path

    @property
    def input_id(self) -> str:
        return input_id(self.path)


@dataclass
class BoundSection:
    section: ConfigSection
    on: bool  # an optional section's toggle; True for the others
    errors: list[str]
    children: list[BoundInput | BoundSection]
    is_section = True

    @property
    def has_errors(self) -> bool:
        return bool(self.errors) or any(
            child.has_errors if child.is_section else child.errors or any(cell.errors for row in child.rows
                                                                          for cell in row.cells)
            for child in self.children
        )


@dataclass(frozen=True)
class ErrorEntry:
    """One error of the summary: the field's label, the id of the input to go to, the message."""

    label: str
    target_id: str
    message: str


def bind_form(form: ConfigForm, state: FormState, errors: dict[str, list[str]]) -> list[BoundSection]:
    return [_bind_section(section, state, errors) for section in form.sections]


def error_summary(sections: list[BoundSection]) -> list[ErrorEntry]:
    """Every error shown in the form, in the order of the page."""
    entries: list[ErrorEntry] = []

    def visit(node, title):
        if node.is_section:
            label = node.section.title if node.section.path else title
            entries.extend(ErrorEntry(label, node.section.html_id, message) for message in node.errors)
            for child in node.children:
                visit(child, title)
            return
        entries.extend(ErrorEntry(node.field.label, node.input_id, message) for message in node.errors)
        for row in node.rows:
            for cell in row.cells:
                entries.extend(ErrorEntry(f"{node.field.label}, row {row.index + 1}: {cell.field.label}",
                                          cell.input_id, message) for message in cell.errors)

    for section in sections:
        visit(section, section.section.title)
    return entries


def _bind_section(section: ConfigSection, state: FormState, errors) -> BoundSection:
    children: list[BoundInput | BoundSection] = []
    for child in section.children:
        if child.is_section:
            children.append(_bind_section(child, state, errors))
        else:
            children.append(_bind_field(child, state, errors))
    return BoundSection(
        section=section,
        on=state.sections_on.get(section.path, True) if section.optional else True,
        errors=errors.get(section.path, []) if section.path else [],
        children=children,
    )


def _bind_field(config_field: ConfigField, state: FormState, errors) -> BoundInput:
    if config_field.widget != "rows":
        return BoundInput(field=config_field, path=config_field.path,
                          value=state.texts.get(config_field.path, ""), errors=errors.get(config_field.path, []))
    rows = [_bind_row(config_field, index, texts, errors)
            for index, texts in enumerate(state.rows.get(config_field.path, []))]
    blank = {cell.path: cell.render_value(cell.default) for cell in config_field.cells}
    return BoundInput(field=config_field, path=config_field.path, value="", rows=rows,
                      errors=errors.get(config_field.path, []),
                      new_row=_bind_row(config_field, ROW_INDEX, blank, {}))


def _bind_row(rows_field: ConfigField, index, texts: dict[str, str], errors) -> BoundRow:
    cells = []
    for cell in rows_field.cells:
        path = f"{rows_field.path}.{index}.{cell.path}"
        cells.append(BoundInput(field=cell, path=path, value=texts.get(cell.path, ""), errors=errors.get(path, [])))
    return BoundRow(index=index, cells=cells)
