"""What the engine host (runners/engine_host: one process per machine holding the models) and its
clients (the server, runs) say to each other over its socket, one JSON line each.

A client's first line is `Hello` (its name, role and the wire it speaks); the host answers
`Welcome`, or `Turned` and closes (another wire version, a host closing). Then each line wraps
one message of a protocol the host serves: `TinkerCall` a Tinker operation (core.tinker_wire:
training clients, samplers, samples; answered by `TinkerReply`s), `InferCall` a test inference
or chat job (core.infer_wire; answered by `InferReply`s), `Ask` the host's state (`Status`);
`Beat` says the client is alive (a client silent past the host's timeout is released, as one
that disconnects is: its models, samplers and jobs go).

Adding a message is a model here in the union of its direction, a `case` in the host's
connection (runners/engine_host/connection.py) and, for a client, in its dispatch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from core.infer_wire import FromWorker, ToWorker
from core.tinker_wire import Reply, Request

WIRE = 1  # the version this tree speaks; a client of another is turned away by name


class _Line(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64"
    )


# Client to host ---------------------------------------------------------------------------


class Hello(_Line):
    kind: Literal["hello"] = "hello"
    wire: int
    client: str  # "server", "run r-3f9c2a1b", ...: what /engine lists it as
    role: Literal["server", "run", "tool"]
    pid: int


class Beat(_Line):
    kind: Literal["beat"] = "beat"


class Ask(_Line):
    """The host's state, answered by a `Status` with the same id."""

    kind: Literal["ask"] = "ask"
    id: int


class TinkerCall(_Line):
    kind: Literal["tinker"] = "tinker"
    request: Request


class InferCall(_Line):
    kind: Literal["infer"] = "infer"
    message: ToWorker


ToHost = Annotated[Hello | Beat | Ask | TinkerCall | InferCall, Field(discriminator="kind")]


# Host to client ---------------------------------------------------------------------------


class Welcome(_Line):
    kind: Literal["welcome"] = "welcome"
    wire: int
    pid: int
    started_at: float  # the host's start, epoch seconds
    device: str  # where its models are: "cpu", "cuda:0"


class Turned(_Line):
    """The host will not serve this client (then it closes the connection)."""

    kind: Literal["turned"] = "turned"
    detail: str


class TinkerReply(_Line):
    kind: Literal["tinker"] = "tinker"
    reply: Reply


class InferReply(_Line):
    kind: Literal["infer"] = "infer"
    message: FromWorker


class BaseHeld(_Line):
    name: str
    bytes: int
    users: int  # training clients and samplers on it


class ClientSeen(_Line):
    client: str
    role: str
    pid: int
    connected_at: float
    seconds_silent: float
    models: int  # training clients it holds
    samplers: int
    jobs: int  # inference jobs running for it


class Status(_Line):
    kind: Literal["status"] = "status"
    id: int
    pid: int
    started_at: float
    wire: int
    budget_bytes: int | None
    bases: list[BaseHeld]
    adapters_resident: int  # adapters in the samplers' slots now
    decode_queue: int  # sample requests waiting for a place in a decode batch
    clients: list[ClientSeen]


FromHost = Annotated[
    Welcome | Turned | TinkerReply | InferReply | Status, Field(discriminator="kind")
]
TO_HOST: TypeAdapter[ToHost] = TypeAdapter(ToHost)
FROM_HOST: TypeAdapter[FromHost] = TypeAdapter(FromHost)
