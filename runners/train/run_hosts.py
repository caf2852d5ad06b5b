"""A run on several engine hosts of its machine (issue 55; its config's `sample_hosts` and
`num_devices`): placed on all of them at once as it opens, its model joined as one host group
over the first `num_devices`, each step's weights spread over the first `sample_hosts`.

    open: EngineService.several -> [home, *others] (each counted by the run's meter)
    group: a model on each of the first num_devices, joined (runners/backends/group_training.py)
    spread: each step's snapshot on home, the same weights opened on the first sample_hosts - 1
            others (runners/backends/spread_sampling.py)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.engine_slots import plan
from core.host_groups import group_backend, hosts_wanted, sampling_hosts
from core.settings import Settings
from core.training_config import TrainingConfig
from runners.episodes.policy import bounded

if TYPE_CHECKING:
    from runners.backends.surface import SamplingClient, ServiceClient, TrainingClient

log = logging.getLogger("runner")
GROUP_TIMEOUT_S = 600.0  # how long a host group's rank waits for the others (join, each sum)


class RunHosts:
    """The engine hosts a run uses beside its first (none unless its config asks), and what
    it does on them."""

    def __init__(self, settings: Settings, config: TrainingConfig) -> None:
        hosts = len(plan(settings))
        self._settings = settings
        self.samplers = sampling_hosts(config.sample_hosts, hosts)
        self.trainers = config.num_devices
        self.wanted = hosts_wanted(config.sample_hosts, config.num_devices, hosts)
        self.others: list[Any] = []  # the services of the hosts beside the first

    def open(
        self, run_id: str, checkpoints: Path, base_model: str, counted: Callable[[Any], Any]
    ) -> Any:
        """The run's services on `wanted` hosts, placed together, each `counted`; the first's."""
        from runners.backends.engine_backend import EngineService

        placed = EngineService.several(self._settings, run_id, checkpoints, base_model, self.wanted)
        services = [counted(service) for service in placed]
        self.others = services[1:]
        log.info("run %s: on engine hosts %s", run_id, ", ".join(s.host for s in services))
        return services[0]

    async def training(
        self, made: Callable[[ServiceClient], Awaitable[TrainingClient]], home: Any, folder: Path
    ) -> TrainingClient:
        """The run's model: `made` on `home`, or on each of the first `trainers` hosts, joined
        as one host group meeting in a file under `folder`."""
        services = [home, *self.others[: self.trainers - 1]]
        if len(services) == 1:
            return await made(home)
        from runners.backends.group_training import GroupTraining

        ranks = await asyncio.gather(*(made(on) for on in services))
        group = GroupTraining(list(ranks))  # type: ignore[arg-type]  # engine clients, counted
        store = folder / "group" / f"{os.getpid()}-{time.time_ns()}"
        store.parent.mkdir(parents=True, exist_ok=True)
        backend = group_backend([on.slot for on in services], self._settings.engine_group_backend)
        joining = group.join(str(store), backend, GROUP_TIMEOUT_S)
        await bounded(joining, self._settings.backend_call_timeout_s, "join the host group")
        log.info("trains on %s hosts as one group (%s)", len(ranks), backend)
        return group

    async def sampler(self, training: TrainingClient, home: SamplingClient) -> SamplingClient:
        """`home` (the snapshot of the run's current weights), or those weights on the first
        `samplers` hosts."""
        others = self.others[: self.samplers - 1]
        if not others:
            return home
        from runners.backends.spread_sampling import spread

        spreading = spread(training, home, others)  # type: ignore[arg-type]
        timeout_s = self._settings.backend_call_timeout_s
        return await bounded(spreading, timeout_s, "the weights to the run's other engine hosts")
