"""A real Ray head for tests: `ray start --head` on loopback with 2 CPUs and no GPU, its own
temporary folder and free ports, stopped (every Ray process with it) by `ray stop`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from tests.support.helpers import wait_for
from tests.support.live_server import free_port

RAY = Path(sys.executable).parent / "ray"


def missing_reason() -> str | None:
    if not RAY.exists():
        return f"{RAY} is missing: the ray extra is not installed (pip install '.[ray]')"
    return None


class RayHead:
    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        # Ray's sockets live under its temp folder: keep the path short (108-byte limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RLCS_")},
            "RAY_USAGE_STATS_ENABLED": "0",
            **(extra_env or {}),  # what every job on this head inherits
        }

    def start(self) -> RayHead:
        argv = [
            str(RAY),
            "start",
            "--head",
            "--num-cpus=2",
            "--num-gpus=0",
            "--node-ip-address=127.0.0.1",
            f"--port={free_port()}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            "--include-dashboard=true",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        subprocess.run(argv, env=self.env, check=True, capture_output=True, timeout=120)
        # The job server answers a little after `ray start` returns.
        wait_for(self._answers, timeout=60, every=0.5)
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.address}/api/version", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        subprocess.run(
            [str(RAY), "stop", "--force"], env=self.env, capture_output=True, timeout=120
        )
        shutil.rmtree(self.temp_dir, ignore_errors=True)
