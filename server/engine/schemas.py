"""GET /engine's answer: this machine's engine hosts as they are now (or that one is not
running)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class BaseOut(BaseModel):
    name: str
    bytes: int = Field(description="Its weights (a claim not loaded yet: its files' size)")
    users: int = Field(description="Training clients and samplers on it (a claim: its clients)")
    loaded: bool = Field(True, description="False: claimed by a client placed here, loading")


class LaneOut(BaseModel):
    base: str
    lane: int
    training: bool = Field(description="A client trains on it now")
    waiting: int = Field(description="Clients waiting for their turn on it")


class ClientOut(BaseModel):
    client: str = Field(description='"server", "inference", or "run r-…"')
    role: str
    pid: int
    connected_at: float
    seconds_silent: float
    models: int = Field(description="Training clients it holds")
    samplers: int
    jobs: int = Field(description="Inference jobs running for it")
    bases: list[str] = Field([], description="The base models its clients and samplers are on")


class HostOut(BaseModel):
    name: str = Field(description='"<machine>/<index>"')
    index: int
    device: str = Field(description='Its device: "cpu", "gpu 0" (running: "cuda:0")')
    running: bool
    pid: int | None = None
    started_at: float | None = Field(None, description="Epoch seconds")
    wire: int | None = None
    memory_budget_bytes: int | None = None
    rss_bytes: int | None = Field(None, description="The host process's resident memory")
    device_bytes: int | None = Field(None, description="Its GPU's memory")
    device_free_bytes: int | None = None
    bases: list[BaseOut] = []
    lanes: list[LaneOut] = []
    adapters_resident: int = 0
    decode_queue: int = Field(0, description="Sample requests waiting for a decode batch")
    clients: list[ClientOut] = []
    log: str = Field(description="The host's log file")


class EngineOut(BaseModel):
    node: str = Field(description="This machine's name (RLCS_NODE_NAME)")
    running: bool = Field(description="Whether any host runs")
    hosts: list[HostOut]
