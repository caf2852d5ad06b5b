"""Start the real server (`python -m server`) as a subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from core import engine_host
from core.settings import PROJECT_ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `timeout` seconds; waited for."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LiveServer:
    """`python -m server`, or any `argv` (say uvicorn with other flags) serving on `self.port`."""

    def __init__(self, var_dir: Path, argv: list[str] | None = None, **env: str) -> None:
        self.var_dir = var_dir
        self.env_overrides = env  # what a server started again on the same folder is given
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            arg.replace("{port}", str(self.port))
            for arg in (argv or [sys.executable, "-m", "server"])
        ]
        self.env = {
            **os.environ,
            "RLCS_VAR_DIR": str(var_dir),
            "RLCS_HOST": "127.0.0.1",
            "RLCS_PORT": str(self.port),
            "RLCS_SUPERVISOR_INTERVAL_S": "0.1",
            "RLCS_INFERENCE_WARMUP": "0",
            "RLCS_ENGINE_IDLE_S": "60",
            **env,
        }
        for key in ("TINKER_API_KEY", "WANDB_API_KEY", "OPENREWARD_API_KEY", "RLCS_API_TOKEN"):
            if key not in env:
                self.env.pop(key, None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._api: httpx.Client | None = None
        self.log = var_dir / "server.log"

    def start(self, timeout: float = 30.0) -> LiveServer:
        self.var_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start in time")

    def kill(self, sig: signal.Signals = signal.SIGKILL, engine: bool = True) -> None:
        """Signal the server and wait for it; then stop its engine host too (which outlives
        a server by design) unless `engine` is False."""
        if self._api is not None:
            self._api.close()
            self._api = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        if engine:
            engine_host.stop(self.var_dir)

    @property
    def api(self) -> httpx.Client:
        """A client of this server's API (tests.support.helpers' start_run, run_of, finish_run),
        closed with the server."""
        if self._api is None:
            self._api = httpx.Client(base_url=self.url, timeout=30)
        return self._api

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.kill(signal.SIGTERM)
