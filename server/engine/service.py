"""The engine host's state for GET /engine, rlctl engine and the dashboard: asked of the host
over the server's connection; a host that is not running is said so (a read starts nothing)."""

from __future__ import annotations

from core import engine_host
from server.engine.link import EngineLink
from server.engine.schemas import BaseOut, ClientOut, EngineOut


class EngineService:
    def __init__(self, link: EngineLink) -> None:
        self._link = link

    def status(self) -> EngineOut:
        log = str(engine_host.folder(self._link.var_dir) / engine_host.LOG)
        if self._link.pid is None and engine_host.running(self._link.var_dir) is None:
            return EngineOut(running=False, log=log)
        status = self._link.status()
        return EngineOut(
            running=True,
            pid=status.pid,
            started_at=status.started_at,
            wire=status.wire,
            memory_budget_bytes=status.budget_bytes,
            bases=[BaseOut(**b.model_dump()) for b in status.bases],
            adapters_resident=status.adapters_resident,
            decode_queue=status.decode_queue,
            clients=[ClientOut(**c.model_dump()) for c in status.clients],
            log=log,
        )
