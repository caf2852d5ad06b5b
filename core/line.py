"""The base of every JSON-lines wire's messages (core/*_wire.py): closed (an unknown key is the
other side's bug, said at once), frozen, bytes as base64 in the line, fields by name or alias."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Line(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
        validate_by_name=True,
        serialize_by_alias=True,
    )
