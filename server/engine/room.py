"""Whether this machine's engine hosts have room for a queued run's base model, asked by the
supervisor before it starts the run: a run whose base no host holds and no host has room for
waits `queued`, its details naming every host and what it holds, and starts once one has room.
A base whose size is not known on disk (tiny-random, a hub id not downloaded) is let through:
its host's own budget check, which the run waits on too, decides."""

from __future__ import annotations

import json
import math

from core.engine_placement import HostView, views
from core.engine_slots import GIB
from core.host_groups import hosts_wanted
from core.model_names import weight_bytes
from core.models import Run
from core.settings import Settings


class EngineRoom:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def wait_reason(self, run: Run) -> str | None:
        """Why `run` cannot start on this machine's hosts now, or None: its base needs a host
        that holds it or has room, one per host it asks for (sample_hosts, num_devices)."""
        base, needed = self._base_of(run)
        if base is None or needed is None:
            return None
        seen = views(self._settings)
        config = json.loads(run.config_json)
        wanted = hosts_wanted(
            config.get("sample_hosts", 1), int(config.get("num_devices", 1)), len(seen)
        )
        usable = [
            v
            for v in seen
            if (v.status is not None and v.status.holds(base)) or self._room(v) >= needed
        ]
        if len(usable) >= wanted:
            return None
        hosts = f"{wanted} engine hosts" if wanted > 1 else "an engine host"
        return (
            f"waiting for room on {hosts} for {base} ({needed / GIB:.2f} GiB): "
            + "; ".join(v.describe() for v in seen)
            + ". It starts once a host has room (runs on other bases ending free it)."
        )

    def _base_of(self, run: Run) -> tuple[str | None, int | None]:
        """The run's base model and its size, for a local run on the shared engine."""
        config = json.loads(run.config_json)
        backend = config.get("backend", "auto")
        engine = config.get("engine", "auto")
        if (self._settings.default_backend if backend == "auto" else backend) != "local":
            return None, None
        if (self._settings.run_engine if engine == "auto" else engine) != "shared":
            return None, None
        base = str(config.get("model_name", ""))
        return base, weight_bytes(base, self._settings.models_dir)

    def _room(self, view: HostView) -> float:
        if view.status is not None:
            return view.room()
        budget = view.slot.budget_bytes(self._settings, None)
        return math.inf if budget is None else float(budget)
