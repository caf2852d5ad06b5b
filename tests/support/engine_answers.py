"""A GET /engine answer of a machine with two GPUs (the first host running: bases, one still
loading; lanes; clients; the second not running), built with the server's own schema so that a
change of its shape shows in the tests that read it (rlctl engine, the dashboard's page)."""

from __future__ import annotations

from typing import Any

from server.engine.schemas import EngineOut

GIB = 2**30
UP_S = 754.0  # the running host's uptime: 12:34
RUN = "r-0000abcd"


def two_hosts(now: float) -> dict[str, Any]:
    """GET /engine of a machine with two GPUs, the first host running, as JSON."""
    running = {
        "name": "box/0",
        "index": 0,
        "device": "cuda:0",
        "running": True,
        "pid": 4242,
        "started_at": now - UP_S,
        "wire": 2,
        "memory_budget_bytes": 63 * GIB,
        "rss_bytes": int(2.5 * GIB),
        "device_bytes": 140 * GIB,
        "device_free_bytes": 100 * GIB,
        "bases": [
            {"name": "Qwen/Qwen3-8B", "bytes": 16 * GIB, "users": 3, "loaded": True},
            {"name": "tiny-random", "bytes": 362_560, "users": 1, "loaded": False},
        ],
        "lanes": [
            {"base": "Qwen/Qwen3-8B", "lane": 0, "training": True, "waiting": 2},
            {"base": "Qwen/Qwen3-8B", "lane": 1, "training": False, "waiting": 0},
        ],
        "adapters_resident": 3,
        "decode_queue": 5,
        "clients": [
            {
                "client": f"run {RUN}",
                "role": "run",
                "pid": 5151,
                "connected_at": now - 60,
                "seconds_silent": 0.2,
                "models": 1,
                "samplers": 2,
                "jobs": 0,
                "bases": ["Qwen/Qwen3-8B"],
            }
        ],
        "log": "/srv/var/engine/box/0/host.log",
    }
    idle = {
        "name": "box/1",
        "index": 1,
        "device": "gpu 1",
        "running": False,
        "log": "/srv/var/engine/box/1/host.log",
    }
    answer = {"node": "box", "running": True, "hosts": [running, idle]}
    return EngineOut.model_validate(answer).model_dump(mode="json")
