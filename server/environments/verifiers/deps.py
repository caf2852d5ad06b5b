"""A verifiers environment's own dependencies (its pyproject.toml's `[project].dependencies`),
installed into the verifiers interpreter as `vf-install` and `prime env install` do, with that
interpreter's lock as constraints, so nothing it pins moves. In the background the first time
the server lists the folder, or for every folder at `make install` (`python -m` this module).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from core.process import Process
from core.settings import PROJECT_ROOT, Settings
from server.environments.verifiers.discovery import stamp

log = logging.getLogger(__name__)
State = Literal["none", "installing", "installed", "failed"]
LOCK = PROJECT_ROOT / "runners" / "verifiers" / "requirements.lock"
# The interpreter's own verifiers serves: an environment's pin on it is not installed (its
# extras are, for the version the lock pins).
OURS = "verifiers"
ERROR_LINES = 15  # of the installer's output, in a failure


@dataclass(frozen=True)
class Dependencies:
    """Where an environment's own dependencies stand."""

    state: State  # none: nothing beyond what the interpreter has is asked for
    requirements: tuple[str, ...] = ()
    error: str | None = None


def requirements(pyproject: Path) -> tuple[str, ...]:
    """What the environment asks for beyond verifiers itself. ValueError naming a requirement
    that is not one (PEP 508)."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project") or {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{pyproject.name} cannot be read: {exc}") from None
    wanted = project.get("dependencies") or []
    if not isinstance(wanted, list):
        raise ValueError(f"{pyproject.name}: [project].dependencies must be a list of strings")
    out = []
    for text in wanted:
        try:
            requirement = Requirement(str(text))
        except InvalidRequirement as exc:
            raise ValueError(
                f"{pyproject.name}: dependency {text!r} is not a requirement: {exc}"
            ) from None
        if canonicalize_name(requirement.name) != OURS:
            out.append(str(text).strip())  # as written
        elif requirement.extras:  # what its extras bring, for the verifiers the lock pins
            out.append(f"{OURS}[{','.join(sorted(requirement.extras))}]")
    return tuple(out)


class DependencyInstaller:
    """The dependencies of every verifiers environment folder, each installed once per what it
    asks for and per interpreter (its outcome kept in `marks`), one installation at a time;
    `close` ends the one running (its outcome not kept: the next start tries again)."""

    def __init__(
        self, python: str, marks: Path, env: Mapping[str, str], timeout_s: float, lock: Path = LOCK
    ) -> None:
        self._python = python
        self._marks = marks
        self._env = dict(env)  # the registries' settings; no keys
        self._timeout_s = timeout_s
        self._lock_file = lock
        self._guard = threading.Lock()
        self._pending: dict[str, str] = {}  # folder -> the key being installed
        self._one_at_a_time = threading.Lock()  # installations into one interpreter take turns
        self._running: set[Process] = set()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> DependencyInstaller:
        return cls(
            settings.verifiers_python,
            settings.var_dir / "verifiers" / "deps",
            settings.inspector_environment(),
            settings.verifiers_install_timeout_s,
        )

    def close(self) -> None:
        """End the installation running, if one is (at server shutdown)."""
        with self._guard:
            self._closed = True
            running = list(self._running)
        for uv in running:
            uv.kill()  # and what it started (a build backend): its whole group

    def state(self, folder: Path) -> Dependencies:
        """Where the folder's dependencies stand, without waiting; ones never installed (for
        this interpreter, this lock, these requirements) are queued now."""
        found = self._asked(folder)
        if isinstance(found, Dependencies):
            return found
        wanted, key = found
        with self._guard:
            if self._pending.get(str(folder)) == key:
                return Dependencies("installing", wanted)
            known = self._read_mark(folder, key)
            if known is not None:
                return known
            self._pending[str(folder)] = key
        # A daemon: a server that stops does not wait for it (close() ends its uv).
        threading.Thread(
            target=self._in_turn, args=(folder, key, wanted), daemon=True, name="verifiers deps"
        ).start()
        return Dependencies("installing", wanted)

    def known(self, folder: Path) -> Dependencies | None:
        """Where they stand as far as is known without installing: None when never tried."""
        found = self._asked(folder)
        if isinstance(found, Dependencies):
            return found
        return self._read_mark(folder, found[1])

    def install_now(self, folder: Path) -> Dependencies:
        """Install the folder's dependencies on this thread (`make install`)."""
        found = self._asked(folder)
        if isinstance(found, Dependencies):
            return found
        return self._run(folder, found[1], found[0])

    def _asked(self, folder: Path) -> Dependencies | tuple[tuple[str, ...], str]:
        """The folder's requirements and their key, or the answer when nothing is to install."""
        try:
            wanted = requirements(folder / "pyproject.toml")
        except ValueError as exc:
            return Dependencies("failed", (), str(exc))
        if not wanted:
            return Dependencies("none")
        return wanted, self._key(wanted)

    def _in_turn(self, folder: Path, key: str, wanted: tuple[str, ...]) -> None:
        try:
            with self._one_at_a_time:
                self._run(folder, key, wanted)
        finally:
            with self._guard:
                self._pending.pop(str(folder), None)

    def _run(self, folder: Path, key: str, wanted: tuple[str, ...]) -> Dependencies:
        log.info("installing %s's dependencies: %s", folder.name, ", ".join(wanted))
        try:
            why = self._uv_install(wanted)
        except OSError as exc:  # uv could not even start: that is its failure
            why = f"{type(exc).__name__}: {exc}"
        done = (
            Dependencies("installed", wanted)
            if why is None
            else Dependencies("failed", wanted, why)
        )
        if self._closed:
            return done  # ended by close(): nothing is known of it
        if why is not None:
            log.warning("%s's dependencies did not install: %s", folder.name, why)
        self._write_mark(folder, key, done)
        return done

    def _uv_install(self, wanted: tuple[str, ...]) -> str | None:
        """`uv pip install` of `wanted` into the interpreter under the lock's pins; None, or
        why it failed (the end of uv's output)."""
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
        if uv is None:
            return "uv is not installed (make install puts it in .venv)"
        pins = ["--constraint", str(self._lock_file)] if self._lock_file.is_file() else []
        argv = [uv, "pip", "install", "--python", self._python, *pins, *wanted]
        started = time.monotonic()
        with self._guard:
            if self._closed:
                return "the server stopped"
            proc = subprocess.Popen(
                argv,
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                process_group=0,  # its own group: a kill reaches the builds it starts
            )
            uv_process = Process("uv pip install", proc, None)
            self._running.add(uv_process)
        try:
            out, err = proc.communicate(timeout=self._timeout_s)
        except subprocess.TimeoutExpired:
            uv_process.kill()
            proc.communicate()
            return (
                f"the installation took over {self._timeout_s:g} s "
                "(RLCS_VERIFIERS_INSTALL_TIMEOUT_S) and was stopped"
            )
        finally:
            with self._guard:
                self._running.discard(uv_process)
        if proc.returncode == 0:
            log.info("installed %s in %.1f s", ", ".join(wanted), time.monotonic() - started)
            return None
        said = (err or out).strip().splitlines()
        lines = [line for line in said if not line.startswith("Using Python")]  # uv's preamble
        return "uv pip install failed: " + "\n".join(lines[-ERROR_LINES:])

    def _key(self, wanted: tuple[str, ...]) -> str:
        """What an installation depends on: the interpreter (made anew, or synced anew to its
        lock, which removes what we added), the lock and the requirements."""
        venv = Path(self._python).parent.parent
        files = stamp(self._lock_file, venv / "pyvenv.cfg", venv / ".installed")
        parts = [self._python, *wanted, *map(str, files)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _mark_path(self, folder: Path) -> Path:
        digest = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
        return self._marks / f"{folder.name}-{digest}.json"

    def _read_mark(self, folder: Path, key: str) -> Dependencies | None:
        try:
            mark = json.loads(self._mark_path(folder).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(mark, dict) or mark.get("key") != key:
            return None
        return Dependencies(mark["state"], tuple(mark["requirements"]), mark.get("error"))

    def _write_mark(self, folder: Path, key: str, done: Dependencies) -> None:
        path = self._mark_path(folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps({"key": key, "folder": str(folder), **asdict(done)}))
        partial.replace(path)


def main() -> int:
    """`make install`: every verifiers environment folder's dependencies, installed now."""
    from server.environments import discovery

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    settings = Settings()
    installer = DependencyInstaller.from_settings(settings)
    try:
        for found in discovery.scan(settings.environment_dirs):
            if found.folder is None:
                continue  # not a verifiers environment
            done, when = installer.known(found.folder), "before"
            if done is None or done.state == "failed":  # asked again: tried again
                done, when = installer.install_now(found.folder), "now"
            if done.state == "failed":
                print(f"{found.name}: its dependencies did not install:\n{done.error}")
            elif done.state == "installed":
                print(f"{found.name}: {', '.join(done.requirements)} installed {when}")
    finally:  # Ctrl-C reaches our group, not uv's: end it with us
        installer.close()
    return 0  # a failure is the environment's, shown in its listing: the install goes on


if __name__ == "__main__":
    sys.exit(main())
