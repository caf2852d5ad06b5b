"""How many of its machine's engine hosts a run uses (issue 55): `sample_hosts` to sample on,
`num_devices` to train on as one group; and what that group sums its gradients over. Torch-free:
the server checks a config with it at POST /runs, the runner places its hosts by it."""

from __future__ import annotations

from typing import Literal

from core.engine_slots import Slot

GroupBackend = Literal["gloo", "nccl"]


def sampling_hosts(sample_hosts: int | Literal["all"], hosts: int) -> int:
    """The hosts a run samples on: `all` is every host of the machine."""
    return hosts if sample_hosts == "all" else sample_hosts


def hosts_wanted(sample_hosts: int | Literal["all"], num_devices: int, hosts: int) -> int:
    """The hosts a run is placed on: as many as it samples or trains on, whichever is more."""
    return max(sampling_hosts(sample_hosts, hosts), num_devices)


def group_backend(slots: list[Slot], asked: Literal["auto", "gloo", "nccl"]) -> GroupBackend:
    """What a group on `slots` sums over: NCCL where each has a GPU of its own (`auto`), else
    gloo; NCCL asked for hosts on the CPU or sharing a GPU: ValueError saying why."""
    gpus = [slot.gpu for slot in slots]
    own_gpus = None not in gpus and len(set(gpus)) == len(gpus)
    if asked == "nccl" and not own_gpus:
        where = "the CPU" if None in gpus else f"GPUs {', '.join(str(g) for g in gpus)}"
        raise ValueError(
            f"RLCS_ENGINE_GROUP_BACKEND=nccl: the group's hosts are on {where}; NCCL takes one "
            "rank per GPU (two ranks on one GPU are refused) and none on the CPU. Use gloo "
            "(or auto), or hosts on GPUs of their own"
        )
    if asked == "auto":
        return "nccl" if own_gpus else "gloo"
    return asked
