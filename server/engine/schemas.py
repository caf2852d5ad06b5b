"""GET /engine's answer: the engine host as it is now (or that none runs)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class BaseOut(BaseModel):
    name: str
    bytes: int
    users: int = Field(description="Training clients and samplers on it")


class ClientOut(BaseModel):
    client: str = Field(description='"server", or "run r-…"')
    role: str
    pid: int
    connected_at: float
    seconds_silent: float
    models: int = Field(description="Training clients it holds")
    samplers: int
    jobs: int = Field(description="Inference jobs running for it")


class EngineOut(BaseModel):
    running: bool
    pid: int | None = None
    started_at: float | None = Field(None, description="Epoch seconds")
    wire: int | None = None
    memory_budget_bytes: int | None = None
    bases: list[BaseOut] = []
    adapters_resident: int = 0
    decode_queue: int = Field(0, description="Sample requests waiting for a decode batch")
    clients: list[ClientOut] = []
    log: str = Field(description="The host's log file")
