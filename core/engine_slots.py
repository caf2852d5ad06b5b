"""The engine hosts of this machine, planned without torch: one per visible GPU by default (one on
a machine without a GPU), or as RLCS_ENGINE_HOSTS says (a count, or each host's GPU). Each host is
a `Slot`: its machine, its index there, the GPU it is pinned to (CUDA_VISIBLE_DEVICES) and how many
hosts share that device (they split its memory budget; on the CPU, its cores too).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from core.settings import Settings

GIB = 1 << 30
CPU_BUDGET_GB = 8.0  # RLCS_ENGINE_MEMORY_BUDGET_GB's default on the CPU
GPU_BUDGET_SHARE = 0.45  # its default on a GPU: a base costs about twice its weights there
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


class SlotsRefused(ValueError):
    """RLCS_ENGINE_HOSTS asks for hosts this machine cannot give; the message says the fix."""


@dataclass(frozen=True)
class Slot:
    node: str  # the machine's name (Settings.node_name)
    index: int  # its place among the machine's hosts, from 0
    gpu: str | None  # its CUDA_VISIBLE_DEVICES; None: the CPU
    share: int  # hosts on its device (itself included)
    hosts: int  # hosts on the machine

    @property
    def name(self) -> str:
        """How /engine and the logs call it: `node/index`."""
        return f"{self.node}/{self.index}"

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"gpu {self.gpu}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Slot:
        return cls(**json.loads(text))

    def cpu_threads(self, cores: int) -> int:
        """The CPU threads its torch may use: the machine's cores split between its hosts."""
        return max(1, cores // self.hosts)

    def budget_bytes(self, settings: Settings, device_bytes: int | None) -> int | None:
        """Its share of its device's budget (RLCS_ENGINE_MEMORY_BUDGET_GB, else 8 GiB on the
        CPU and 45% of a GPU's memory); None for a GPU whose memory is not known here."""
        if settings.engine_memory_budget_gb is not None:
            whole = settings.engine_memory_budget_gb * GIB
        elif self.gpu is None:
            whole = CPU_BUDGET_GB * GIB
        elif device_bytes is not None:
            whole = GPU_BUDGET_SHARE * device_bytes
        else:
            return None
        return int(whole / self.share)


def visible_gpus(settings: Settings, driver: Path = NVIDIA_GPUS) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES where set, else every GPU the NVIDIA
    driver lists; none when the settings keep the engine on the CPU."""
    if settings.device == "cpu":
        return []
    if settings.cuda_visible_devices is not None:
        return [part.strip() for part in settings.cuda_visible_devices.split(",") if part.strip()]
    try:
        count = sum(1 for entry in driver.iterdir() if entry.is_dir())
    except OSError:
        return []
    return [str(i) for i in range(count)]


def plan(settings: Settings, gpus: list[str] | None = None, cores: int | None = None) -> list[Slot]:
    """This machine's hosts as the settings ask (SlotsRefused, saying the fix, for more hosts
    than it has devices)."""
    gpus = visible_gpus(settings) if gpus is None else gpus
    cores = (os.cpu_count() or 1) if cores is None else cores
    devices = _devices(settings.engine_hosts, gpus, cores)
    return [
        Slot(settings.node_name, i, gpu, devices.count(gpu), len(devices))
        for i, gpu in enumerate(devices)
    ]


def this_slot(settings: Settings) -> Slot:
    """The slot an engine host was started for (RLCS_ENGINE_SLOT), else the machine's first."""
    if settings.engine_slot:
        return Slot.from_json(settings.engine_slot)
    return plan(settings)[0]


def _devices(asked: str | None, gpus: list[str], cores: int) -> list[str | None]:
    """Each host's GPU (None: the CPU), in slot order."""
    text = (asked or "").strip()
    if not text or text == "auto":
        return list(gpus) if gpus else [None]
    if text.isdigit():
        return _counted(int(text), gpus, cores)
    wanted = [part.strip() for part in text.split(",")]
    unknown = [part for part in wanted if part not in gpus]
    if unknown or not wanted:
        seen = ", ".join(gpus) or "none"
        raise SlotsRefused(
            f"RLCS_ENGINE_HOSTS={text}: {', '.join(unknown) or 'an empty entry'} is no GPU of "
            f"this machine (visible: {seen}); give a count, or the GPU of each host from those"
        )
    return list(wanted)


def _counted(count: int, gpus: list[str], cores: int) -> list[str | None]:
    if count < 1:
        raise SlotsRefused("RLCS_ENGINE_HOSTS must be at least 1 (unset: one per GPU)")
    if gpus and count > len(gpus):
        raise SlotsRefused(
            f"RLCS_ENGINE_HOSTS={count} is more hosts than this machine's {len(gpus)} GPU(s) "
            f"({', '.join(gpus)}); ask for at most {len(gpus)}, or name each host's GPU to share "
            f"one on purpose (e.g. RLCS_ENGINE_HOSTS={','.join([gpus[0]] * 2)})"
        )
    if not gpus and count > cores:
        raise SlotsRefused(
            f"RLCS_ENGINE_HOSTS={count} is more hosts than this machine's {cores} CPU cores (it "
            f"has no GPU; its hosts split the cores); ask for at most {cores}"
        )
    return list(gpus[:count]) if gpus else [None] * count
