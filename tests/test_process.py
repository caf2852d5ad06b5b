"""core.process in real processes: a logged process's output in its log after a line naming it,
a secret blanked out on the way, and an interrupt that ends what the process started too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.process import REDACTED, start_logged
from tests.support.helpers import pid_alive, wait_for

SECRET = "sk-the-runs-key-1234"


def test_a_secret_never_reaches_the_log(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "api.log"
    program = f"print('serving with key {SECRET}'); print('ready', flush=True)"
    started = start_logged(
        "the test API", [sys.executable, "-c", program], tmp_path, os.environ, log_path, SECRET
    )
    wait_for(lambda: started.exit_code() is not None, 30)
    started.join_log()
    text = log_path.read_text()
    assert text.startswith("--- ") and "-c" in text.splitlines()[0]
    assert f"serving with key {REDACTED.decode()}" in text and "ready" in text
    assert SECRET not in text.split("\n", 1)[1]  # its argv, in the first line, has it: ours
    assert started.exit_status() == "exit code 0"


def test_an_interrupt_ends_the_process_and_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    program = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    started = start_logged(
        "the test env", [sys.executable, "-c", program], tmp_path, os.environ, tmp_path / "env.log"
    )
    wait_for(lambda: pid_file.is_file() and pid_file.read_text() != "", 30)
    grandchild = int(pid_file.read_text())
    started.interrupt(grace_s=10.0)  # returns at its exit: a loaded machine may take seconds
    assert not started.alive
    assert "KeyboardInterrupt" in started.describe()  # SIGINT came first: Python unwound
    wait_for(lambda: not pid_alive(grandchild), 5)
