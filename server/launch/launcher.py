"""What every launcher does for the supervisor: start a queued run's attempt, watch the attempts
it started, pass on a stop, read an attempt's log. Each run is watched by the launcher that
started its current attempt (`Run.launcher`), whatever the configured launcher is now."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from core.models import Run
from core.settings import Settings

LOCAL_LAUNCHER = "local"


class LauncherHealth(BaseModel):
    """What /health says of the launcher that starts new runs."""

    kind: str = Field(description="local (child processes) or ray (RLCS_LAUNCHER)")
    address: str | None = Field(description="The Ray job server (RLCS_RAY_ADDRESS)")
    reachable: bool
    reason: str | None = Field(description="Why the launcher cannot start runs now")


class Launcher(Protocol):
    kind: str

    def health(self) -> LauncherHealth:
        """Whether it can start runs now, and if not why."""
        ...

    def start(self, run: Run) -> bool:
        """Start a queued run's attempt; False when it cannot start anything now (the run
        stays queued saying why, and no later run is tried this tick)."""
        ...

    def reconcile(self, runs: list[Run]) -> None:
        """After a (re)start: its unfinished runs are adopted again, or their end is settled."""
        ...

    def watch(self, runs: list[Run]) -> None:
        """One look at the attempts it started (`runs`: its unfinished ones in the database):
        settle those that ended, enforce the stop grace of those stopping."""
        ...

    def request_stop(self, run: Run) -> None:
        """`run` was just marked stopping: pass the request on now (the runner also reads it
        from the database)."""
        ...

    def log_text(self, run: Run) -> str | None:
        """The attempt's whole log where the launcher keeps it; None: read the run folder's."""
        ...

    def hand_over(self) -> None:
        """Stop watching (this server stops, or another one supervises now); attempts go on."""
        ...


def launcher_of(run: Run) -> str:
    """The launcher that started the run's current attempt (older rows say nothing: local)."""
    return run.launcher or LOCAL_LAUNCHER


def runner_argv(settings: Settings, run_dir: str | Path) -> list[str]:
    """The command of one attempt of a run, whichever launcher starts it."""
    return [settings.python_executable, "-m", settings.runner_module, "--run-dir", str(run_dir)]
