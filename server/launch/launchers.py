"""The launchers this server knows, by kind: `local` always, `ray` made on first use (a server on
the local launcher never loads Ray), and any a domain registers for runs it starts itself."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine

from core.models import RAY_LAUNCHER, Run
from core.settings import Settings
from server.launch.launcher import Launcher, launcher_of
from server.launch.local import LocalLauncher


class Launchers:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self._settings = settings
        self._made: dict[str, Launcher] = {LocalLauncher.kind: LocalLauncher(settings, engine)}
        self._makers: dict[str, Callable[[], Launcher]] = {RAY_LAUNCHER: self._make_ray}
        self._engine = engine

    def _make_ray(self) -> Launcher:
        from server.launch.ray import RayLauncher

        return RayLauncher(self._settings, self._engine)

    def register(self, launcher: Launcher) -> None:
        self._made[launcher.kind] = launcher

    def get(self, kind: str) -> Launcher:
        if kind not in self._made:
            self._made[kind] = self._makers[kind]()
        return self._made[kind]

    def configured(self) -> Launcher:
        """The one that starts queued runs (RLCS_LAUNCHER)."""
        return self.get(self._settings.launcher)

    def of(self, run: Run) -> Launcher:
        """The one that started the run's current attempt."""
        return self.get(launcher_of(run))

    def made(self) -> list[Launcher]:
        return list(self._made.values())
