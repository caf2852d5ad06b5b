"""What an engine host (runners/engine_host: one process per device holding the models) and its
clients (the server, runs, the inference client) say to each other over its socket, one JSON line
each.

A client's first line is `Hello` (its name, role and the wire it speaks); the host answers
`Welcome`, or `Turned` and closes (another wire version, a host closing). Then each line wraps
one message of a protocol the host serves: `TinkerCall` a Tinker operation (core.tinker_wire:
training clients, samplers, samples; answered by `TinkerReply`s), `InferCall` a chat job
(core.infer_wire; answered by `InferReply`s), `Ask` the host's state (`Status`), `Claim` a base
model the client was placed here for (core/engine_placement.py; answered by `Status` once
counted); `Beat` says the client is alive (a client silent past the host's timeout is released,
as one that disconnects is: its models, samplers, jobs and claims go). An `Ask` as the first
line is a probe: answered, then the connection closes, no client made.

Adding a message is a model here in the union of its direction, a `case` in the host's
connection (runners/engine_host/connection.py) and, for a client, in its dispatch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from core.infer_wire import FromWorker, ToWorker
from core.line import Line
from core.tinker_wire import Reply, Request

WIRE = 2  # the version this tree speaks; a client of another is turned away by name


# Client to host ---------------------------------------------------------------------------


class Hello(Line):
    kind: Literal["hello"] = "hello"
    wire: int
    client: str  # "server", "run r-3f9c2a1b", ...: what /engine lists it as
    role: Literal["server", "run", "inference", "tool"]
    pid: int


class Beat(Line):
    kind: Literal["beat"] = "beat"


class Ask(Line):
    """The host's state, answered by a `Status` with the same id."""

    kind: Literal["ask"] = "ask"
    id: int


class TinkerCall(Line):
    kind: Literal["tinker"] = "tinker"
    request: Request


class InferCall(Line):
    kind: Literal["infer"] = "infer"
    message: ToWorker


class Claim(Line):
    """A base model this client will load here, counted against the host's room until it is
    loaded (or the client goes); answered by a `Status` with the same id."""

    kind: Literal["claim"] = "claim"
    id: int
    base: str


ToHost = Annotated[Hello | Beat | Ask | Claim | TinkerCall | InferCall, Field(discriminator="kind")]


# Host to client ---------------------------------------------------------------------------


class Welcome(Line):
    kind: Literal["welcome"] = "welcome"
    wire: int
    pid: int
    started_at: float  # the host's start, epoch seconds
    device: str  # where its models are: "cpu", "cuda:0"
    slot: str  # which host of its machine: "node/index"


class Turned(Line):
    """The host will not serve this client (then it closes the connection)."""

    kind: Literal["turned"] = "turned"
    detail: str


class TinkerReply(Line):
    kind: Literal["tinker"] = "tinker"
    reply: Reply


class InferReply(Line):
    kind: Literal["infer"] = "infer"
    message: FromWorker


class BaseHeld(Line):
    name: str
    bytes: int  # its weights; for a claim not loaded yet, the weight files' size (0: unknown)
    users: int  # training clients and samplers on it; for a claim, the clients claiming it
    loaded: bool = True  # False: claimed by a client placed here, not loaded yet


class LaneHeld(Line):
    """One training lane of a base: whether a client trains on it now, and how many wait."""

    base: str
    lane: int
    training: bool
    waiting: int


class ClientSeen(Line):
    client: str
    role: str
    pid: int
    connected_at: float
    seconds_silent: float
    models: int  # training clients it holds
    samplers: int
    jobs: int  # inference jobs running for it
    bases: list[str] = []  # the base models its training clients and samplers are on


class Status(Line):
    kind: Literal["status"] = "status"
    id: int
    pid: int
    started_at: float
    wire: int
    slot: str  # "node/index"
    device: str  # "cpu", "cuda:0"
    device_bytes: int | None  # the GPU's memory (None on the CPU)
    device_free_bytes: int | None  # what the GPU has free now
    rss_bytes: int  # the host process's resident memory
    budget_bytes: int | None
    bases: list[BaseHeld]  # loaded, then claimed and not loaded yet
    lanes: list[LaneHeld]
    adapters_resident: int  # adapters in the samplers' slots now
    decode_queue: int  # sample requests waiting for a place in a decode batch
    clients: list[ClientSeen]

    def held_bytes(self) -> int:
        """What its bases take of its budget, claims included."""
        return sum(base.bytes for base in self.bases)

    def holds(self, base: str) -> bool:
        """Whether `base` is loaded or claimed here."""
        return any(held.name == base for held in self.bases)


FromHost = Annotated[
    Welcome | Turned | TinkerReply | InferReply | Status, Field(discriminator="kind")
]
TO_HOST: TypeAdapter[ToHost] = TypeAdapter(ToHost)
FROM_HOST: TypeAdapter[FromHost] = TypeAdapter(FromHost)
