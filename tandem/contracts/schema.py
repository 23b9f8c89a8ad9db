"""Schema versions of stored and sent records, and the base every versioned record derives from."""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator

SCHEMA_VERSION = 1


class SchemaVersionError(ValueError):
    """A record was written with a schema this reader does not understand."""


class Record(BaseModel):
    """A record that crosses a process boundary: it says its schema, and refuses one it does not know."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    # Versions this reader understands. A record whose shape changed lists its
    # older versions too and upgrades them in a validator of its own.
    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({SCHEMA_VERSION})

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_schema(cls, data):
        if isinstance(data, dict):
            version = data.get("schema_version", cls.model_fields["schema_version"].default)
            try:
                readable = version in cls.readable_schema_versions
            except TypeError:
                return data  # not even hashable (a list, a dict): the field's own validation says so
            if not readable:
                raise SchemaVersionError(
                    f"{cls.__name__} schema_version {version} is not supported "
                    f"(this reader understands {sorted(cls.readable_schema_versions)})"
                )
        return data


class StreamRecord(Record):
    """A record that travels as one Redis stream entry: its schema version and its JSON payload."""

    def to_stream_fields(self) -> dict[str, str]:
        return {"schema_version": str(self.schema_version), "payload": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict) -> Self:
        """The record of an entry as Redis returns it (field names as bytes) or as written (str)."""
        payload = fields.get(b"payload", fields.get("payload"))
        return cls.model_validate_json(payload)
