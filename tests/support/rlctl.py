"""`rlctl` as a user or a script runs it: `python -m cli` in a subprocess, pointed at a server."""

from __future__ import annotations

import os
import subprocess
import sys

from core.settings import PROJECT_ROOT

Result = subprocess.CompletedProcess[str]


def run_cli(url: str, *args: str, timeout: float = 60, **env: str) -> Result:
    """`python -m cli ARGS` with RLCS_URL=url (and no other RLCS_ variable but those given)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RLCS_")}
    environ.update({"RLCS_URL": url, **env})
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=PROJECT_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
