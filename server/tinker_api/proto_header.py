"""The model and sequence ids of a forward_backward body, read from its protobuf wire format
without the SDK (the server does not import tinker): enough to find the model and to apply a
retried request once. The engine host decodes the whole body."""

from __future__ import annotations

MODEL_ID_FIELD, SEQ_ID_FIELD = 1, 2  # ForwardBackwardRequest.model_id, .seq_id
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class ProtoHeaderError(ValueError):
    """The body's framing is broken; the message names the field."""


def model_and_seq(body: bytes) -> tuple[str, int]:
    model_id, seq_id = "", 0
    pos = 0
    while pos < len(body):
        key, pos = _varint(body, pos, "a field key")
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _varint(body, pos, f"field {field}")
            if field == SEQ_ID_FIELD:
                seq_id = value
        elif wire == LENGTH:
            size, pos = _varint(body, pos, f"field {field}'s length")
            if pos + size > len(body):
                raise ProtoHeaderError(f"body: field {field} runs past the end of the body")
            if field == MODEL_ID_FIELD:
                try:
                    model_id = body[pos : pos + size].decode()
                except UnicodeDecodeError:
                    raise ProtoHeaderError("model_id: not UTF-8 text") from None
            pos += size
        elif wire in (FIXED64, FIXED32):
            pos += 8 if wire == FIXED64 else 4
        else:
            raise ProtoHeaderError(f"body: field {field} has wire type {wire}, not protobuf 3")
    if pos != len(body):
        raise ProtoHeaderError("body: the last field is cut short")
    if not model_id:
        raise ProtoHeaderError("model_id: missing; name the model create_model returned")
    return model_id, seq_id


def _varint(body: bytes, pos: int, what: str) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(body) or shift > 63:
            raise ProtoHeaderError(f"body: {what} is cut short or not a varint")
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
