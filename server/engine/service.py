"""This machine's engine hosts for GET /engine, rlctl engine and the dashboard: each asked for
its state on a probe of its own (no client is made); a host that is not running is said so (a
read starts nothing)."""

from __future__ import annotations

from core import engine_host
from core.engine_placement import probe
from core.engine_slots import Slot
from core.settings import Settings
from server.engine.schemas import BaseOut, ClientOut, EngineOut, HostOut, LaneOut


class EngineService:
    def __init__(self, settings: Settings, slots: list[Slot]) -> None:
        self._settings = settings
        self._slots = slots

    def status(self) -> EngineOut:
        hosts = [self._host(slot) for slot in self._slots]
        return EngineOut(
            node=self._settings.node_name,
            running=any(h.running for h in hosts),
            hosts=hosts,
        )

    def _host(self, slot: Slot) -> HostOut:
        var_dir = self._settings.var_dir
        idle = HostOut(
            name=slot.name,
            index=slot.index,
            device=slot.device,
            running=False,
            log=str(engine_host.log_path(var_dir, slot)),
        )
        status = probe(var_dir, slot)
        if status is None:
            return idle
        return idle.model_copy(
            update={
                "device": status.device,
                "running": True,
                "pid": status.pid,
                "started_at": status.started_at,
                "wire": status.wire,
                "memory_budget_bytes": status.budget_bytes,
                "rss_bytes": status.rss_bytes,
                "device_bytes": status.device_bytes,
                "device_free_bytes": status.device_free_bytes,
                "bases": [BaseOut(**b.model_dump()) for b in status.bases],
                "lanes": [LaneOut(**lane.model_dump()) for lane in status.lanes],
                "adapters_resident": status.adapters_resident,
                "decode_queue": status.decode_queue,
                "clients": [ClientOut(**c.model_dump()) for c in status.clients],
            }
        )
