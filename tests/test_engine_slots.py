"""The engine hosts a machine plans (core/engine_slots.py) and where a base model is placed among
them (core/engine_placement.py): one host per GPU by default and one on a CPU-only machine,
RLCS_ENGINE_HOSTS as a count or each host's GPU, a clear refusal for more hosts than devices;
placement by base, then an empty host, then the most room; a host of the former layout stopped.
Ray asks no GPU for a run on its node's hosts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core import engine_host, procs
from core.engine_placement import HostView, choose, choose_several, placing_several
from core.engine_slots import GIB, Slot, SlotsRefused, plan, visible_gpus
from core.engine_wire import BaseHeld, Status
from core.host_groups import group_backend
from server.launch.ray import resources_for
from tests.support.settings import make_settings


def slots(tmp_path: Path, hosts: str | None, gpus: list[str], cores: int = 2) -> list[Slot]:
    return plan(make_settings(tmp_path, engine_hosts=hosts), gpus=gpus, cores=cores)


def test_one_host_per_gpu_and_one_on_a_cpu_only_machine(tmp_path: Path) -> None:
    (cpu,) = slots(tmp_path, None, [])
    assert (cpu.gpu, cpu.share, cpu.hosts, cpu.device) == (None, 1, 1, "cpu")
    assert [s.gpu for s in slots(tmp_path, None, ["0", "1", "2"])] == ["0", "1", "2"]
    assert [s.name.split("/")[-1] for s in slots(tmp_path, None, ["0", "1"])] == ["0", "1"]


def test_a_count_or_each_hosts_gpu(tmp_path: Path) -> None:
    assert [s.gpu for s in slots(tmp_path, "2", ["0", "1", "2"])] == ["0", "1"]
    shared = slots(tmp_path, "0,0,1", ["0", "1"])
    assert [(s.gpu, s.share) for s in shared] == [("0", 2), ("0", 2), ("1", 1)]
    two_on_cpu = slots(tmp_path, "2", [], cores=2)
    assert [(s.gpu, s.share) for s in two_on_cpu] == [(None, 2), (None, 2)]
    assert two_on_cpu[0].cpu_threads(2) == 1  # the cores split between the hosts


@pytest.mark.parametrize(
    ("hosts", "gpus", "cores", "said"),
    [
        ("3", ["0", "1"], 16, "RLCS_ENGINE_HOSTS=0,0"),  # share one on purpose
        ("3", [], 2, "2 CPU cores"),
        ("0,7", ["0", "1"], 16, r"7 is no GPU of this machine \(visible: 0, 1\)"),
        ("0", ["0"], 16, "at least 1"),
    ],
)
def test_more_hosts_than_devices_are_refused_saying_the_fix(
    tmp_path: Path, hosts: str, gpus: list[str], cores: int, said: str
) -> None:
    with pytest.raises(SlotsRefused, match=said):
        slots(tmp_path, hosts, gpus, cores)


def test_budgets_split_between_the_hosts_of_a_device(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    cpu, _ = plan(make_settings(tmp_path, engine_hosts="2"), gpus=[], cores=2)
    assert cpu.budget_bytes(settings, None) == 4 * GIB  # 8 GiB on the CPU, halved
    gpu, _ = plan(make_settings(tmp_path, engine_hosts="0,0"), gpus=["0"], cores=2)
    assert gpu.budget_bytes(settings, 100 * GIB) == int(0.45 * 100 * GIB / 2)
    assert gpu.budget_bytes(settings, None) is None  # not known until the host runs
    fixed = make_settings(tmp_path, engine_memory_budget_gb=10)
    assert gpu.budget_bytes(fixed, 100 * GIB) == 5 * GIB


def test_visible_gpus_from_cuda_visible_devices_or_the_driver(tmp_path: Path) -> None:
    driver = tmp_path / "gpus"
    for address in ("0000:01:00.0", "0000:02:00.0"):
        (driver / address).mkdir(parents=True)
    assert visible_gpus(make_settings(tmp_path), driver) == ["0", "1"]
    pinned = make_settings(tmp_path, cuda_visible_devices="3, 5")
    assert visible_gpus(pinned, driver) == ["3", "5"]
    assert visible_gpus(make_settings(tmp_path, cuda_visible_devices=""), driver) == []
    assert visible_gpus(make_settings(tmp_path, device="cpu"), driver) == []
    assert visible_gpus(make_settings(tmp_path), tmp_path / "none") == []


def test_too_many_hosts_stop_the_server_with_one_line(tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    env = {
        **os.environ,
        "RLCS_VAR_DIR": str(tmp_path),
        "RLCS_DEVICE": "cpu",
        "RLCS_ENGINE_HOSTS": str(cores + 1),
    }
    done = subprocess.run(
        [sys.executable, "-m", "server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"RLCS_ENGINE_HOSTS={cores + 1}" in lines[0], done.stderr


def status(index: int, bases: list[BaseHeld], budget: int | None = 8 * GIB) -> Status:
    return Status(
        id=0,
        pid=1,
        started_at=0.0,
        wire=2,
        slot=f"vm/{index}",
        device="cpu",
        device_bytes=None,
        device_free_bytes=None,
        rss_bytes=0,
        budget_bytes=budget,
        bases=bases,
        lanes=[],
        adapters_resident=0,
        decode_queue=0,
        clients=[],
    )


def held(name: str, gib: float, users: int = 1, loaded: bool = True) -> BaseHeld:
    return BaseHeld(name=name, bytes=int(gib * GIB), users=users, loaded=loaded)


def test_placement_by_base_then_an_empty_host_then_the_most_room(tmp_path: Path) -> None:
    a, b, c = slots(tmp_path, "3", [], cores=3)
    running_x = HostView(a, status(0, [held("X", 1)]))
    # A host holding the base (or claimed for it) wins, the fewest users first.
    views = [running_x, HostView(b, status(1, [held("X", 1, users=3)])), HostView(c, None)]
    assert choose(views, "X") == a
    claimed = [
        HostView(a, status(0, [held("Y", 1)])),
        HostView(b, status(1, [held("X", 1, 1, False)])),
    ]
    assert choose(claimed, "X") == b
    # Else an empty host: a running one before one that would have to start.
    assert choose([running_x, HostView(b, None), HostView(c, status(2, []))], "Y") == c
    assert choose([running_x, HostView(b, None), HostView(c, None)], "Y") == b
    # Else the most room left under its budget.
    full = [
        HostView(a, status(0, [held("X", 6)])),
        HostView(b, status(1, [held("Z", 2)])),
        HostView(c, status(2, [held("W", 5)])),
    ]
    assert choose(full, "Y") == b


def test_ray_asks_no_gpu_for_a_run_on_its_nodes_engine_hosts(tmp_path: Path) -> None:
    cuda = make_settings(tmp_path, device="cuda")
    assert resources_for({"backend": "local"}, cuda).num_gpus == 0  # the hosts own the GPUs
    assert resources_for({"backend": "local", "engine": "private"}, cuda).num_gpus == 1
    assert resources_for({"backend": "local", "num_gpus": 2}, cuda).num_gpus == 2
    private = make_settings(tmp_path, device="cuda", run_engine="private")
    assert resources_for({"backend": "local"}, private).num_gpus == 1


def test_a_host_of_the_former_layout_is_stopped_not_run_beside(tmp_path: Path) -> None:
    """A host recorded where one host per var/ folder kept its record (var/engine/host.json)
    is stopped before a host of this layout starts: never two on one machine's models."""
    var_dir = tmp_path / "var"
    former = engine_host.root(var_dir)
    former.mkdir(parents=True)
    stand_in = subprocess.Popen(["sleep", "600"], start_new_session=True)
    record = engine_host.HostRecord(
        pid=stand_in.pid,
        started=procs.process_start_time(stand_in.pid),
        started_at=0.0,
        wire=1,
        socket=str(former / "host.sock"),
    )
    engine_host.write_record(former, record)
    try:
        assert engine_host.retire_former(var_dir) is True
        assert stand_in.wait(timeout=30) == -signal.SIGTERM
        assert not (former / engine_host.RECORD).exists()
        assert engine_host.retire_former(var_dir) is False  # nothing left to stop
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_run_on_several_hosts_gets_different_ones_in_placement_order(tmp_path: Path) -> None:
    a, b, c = slots(tmp_path, "3", [], cores=3)
    views = [
        HostView(a, status(0, [held("Y", 1)])),
        HostView(b, status(1, [held("X", 1)])),
        HostView(c, None),
    ]
    # Its base's holder first (no claim there), then an empty host (claimed), then the roomiest.
    placed = choose_several(views, "X", 3)
    assert [(p.slot, p.claim) for p in placed] == [(b, False), (c, True), (a, True)]
    assert [p.slot for p in choose_several(views, "X", 1)] == [b]


def test_more_hosts_than_the_machine_has_are_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, engine_hosts="2", device="cpu")
    with pytest.raises(ValueError, match="3 engine hosts asked for; this machine has 2"):
        with placing_several(settings, "X", 3):
            pass


def test_a_group_sums_over_nccl_only_where_each_host_has_a_gpu(tmp_path: Path) -> None:
    own = slots(tmp_path, "0,1", ["0", "1"])
    shared = slots(tmp_path, "0,0", ["0"])
    cpu = slots(tmp_path, "2", [])
    assert group_backend(own, "auto") == "nccl"
    assert group_backend(shared, "auto") == group_backend(cpu, "auto") == "gloo"
    assert group_backend(own, "gloo") == "gloo"
    with pytest.raises(ValueError, match="two ranks on one GPU are refused"):
        group_backend(shared, "nccl")
    with pytest.raises(ValueError, match="on the CPU"):
        group_backend(cpu, "nccl")
