"""The environment catalog: listing by source scan, lookup by name, inspecting on demand.

Listing never imports. What needs the class (its Config) comes from an inspector subprocess
(server.environments.inspector) on select, config, run and inference; a failure is remembered
(per file version) and shown in the listing as `importable: false` with the error.
"""

from __future__ import annotations

import difflib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.frameworks import Framework
from core.spec import EnvSource
from core.verifiers import Generation
from server.environments import discovery
from server.environments.inspector import ConfigSchema, InspectFailed, Inspectors
from server.environments.schemas import EnvironmentOut
from server.environments.verifiers.deps import Dependencies, DependencyInstaller
from server.errors import Conflict, InvalidValue, NotFound

# Letters, digits, '_', '-' and single dots between them: nothing that walks a path.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*$")
NAME_MAX = 128
COUNT_TTL_S = 10.0  # how old the environment count /health reports may be
Tried = tuple[float, Dependencies | None]  # a file's mtime, a verifiers environment's deps


@dataclass(frozen=True)
class EnvEntry:
    name: str
    class_name: str | None
    file_path: str
    description: str
    importable: bool | None
    error: str | None
    path: Path
    framework: Framework = "rlcs"
    generation: Generation | None = None
    dependencies: Dependencies | None = None  # verifiers: its own, from its pyproject.toml
    folder: Path | None = None  # verifiers: the folder of its pyproject.toml

    def source(self, config: dict[str, Any], weight: float = 1.0) -> EnvSource:
        """This environment with `config`, as a run or the inference worker receives it."""
        if self.class_name is None:
            raise ValueError(f"{self.file_path} holds no environment class")
        return EnvSource(
            env_file=str(self.path),
            env_class=self.class_name,
            config=config,
            weight=weight,
            framework=self.framework,
        )


class Catalog:
    def __init__(
        self,
        dirs: list[Path],
        root: Path,
        inspectors: Inspectors | None = None,
        clock: Callable[[], float] = time.monotonic,
        dependencies: DependencyInstaller | None = None,
    ) -> None:
        # Resolved once, so every path discovery returns is absolute and needs no resolve().
        self._dirs = [d.resolve() for d in dirs]
        self._root = root.resolve()
        self._inspectors = inspectors
        self._dependencies = dependencies
        self._lock = threading.Lock()
        # (path, class, framework) -> (what it was tried with, Config schema or error text) of
        # the last try: the file's mtime and, for a verifiers environment, its dependencies (an
        # ImportError is stale once a package it lacked is installed).
        self._imports: dict[tuple[Path, str, Framework], tuple[Tried, ConfigSchema | str]] = {}
        self._inspecting: dict[tuple[Path, str, Framework], threading.Lock] = {}
        self._clock = clock
        self._count: tuple[float, int] | None = None  # (when, how many) of the last scan

    def listing(self) -> list[EnvironmentOut]:
        """What GET /environments (and /mcp's rl_list_environments) answers."""
        return [EnvironmentOut.model_validate(e, from_attributes=True) for e in self.list()]

    def list(self) -> list[EnvEntry]:
        entries = [self._entry(found) for found in discovery.scan(self._dirs)]
        self._count = (self._clock(), len(entries))
        return entries

    def count(self) -> int:
        """How many environments there are, from a scan at most COUNT_TTL_S old (cheap)."""
        last = self._count
        if last is None or self._clock() - last[0] > COUNT_TTL_S:
            return len(self.list())
        return last[1]

    def get(self, name: str) -> EnvEntry:
        check_name(name)
        entries = self.list()
        for entry in entries:
            if entry.name == name:
                return entry
        close = difflib.get_close_matches(name, [e.name for e in entries], n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        known = ", ".join(e.name for e in entries) or "none"
        raise NotFound(
            f"Unknown environment '{name}'.{hint} Known environments: {known} "
            "(GET /environments lists them).",
            close_matches=close,
        )

    def load(self, name: str) -> tuple[EnvEntry, ConfigSchema]:
        """The environment's Config, from its inspector; a failure becomes a 409 naming it."""
        entry = self.get(name)
        if entry.class_name is None:
            raise Conflict(
                f"Environment '{name}' cannot be imported: {entry.error}. Fix {entry.file_path}.",
                importable=False,
                error=entry.error,
            )
        _check_installed(entry)
        if self._inspectors is None:
            raise RuntimeError("this catalog lists only; it was built without inspectors")
        key = (entry.path, entry.class_name, entry.framework)
        with self._lock:
            # One inspection per file at a time; other files are not held up meanwhile.
            file_lock = self._inspecting.setdefault(key, threading.Lock())
        with file_lock:
            mtime = _mtime(entry.path)
            tried = (mtime, entry.dependencies)
            hit = self._imports.get(key)
            if hit is None or hit[0] != tried:
                try:
                    result: ConfigSchema | str = self._inspectors.inspect(
                        entry.path, entry.class_name, mtime, entry.framework
                    )
                except InspectFailed as exc:
                    result = str(exc)
                self._imports[key] = hit = (tried, result)
        if isinstance(hit[1], str):
            raise Conflict(
                f"Environment '{name}' cannot be imported: {hit[1]}. {_fix(hit[1], entry)}",
                importable=False,
                error=hit[1],
            )
        return self._entry_for(entry), hit[1]

    def close(self) -> None:
        """End the inspector processes and a dependency installation (at server shutdown)."""
        if self._inspectors is not None:
            self._inspectors.close()
        if self._dependencies is not None:
            self._dependencies.close()

    def _entry(self, found: discovery.FoundEnv) -> EnvEntry:
        importable: bool | None = None
        error = found.syntax_error
        dependencies = None
        if found.folder is not None and self._dependencies is not None:
            dependencies = self._dependencies.state(found.folder)
        if error is not None:
            importable = False
        elif dependencies is not None and dependencies.state == "failed":
            importable, error = False, f"its dependencies did not install: {dependencies.error}"
        elif found.class_name is not None:
            hit = self._imports.get((found.path, found.class_name, found.framework))
            if hit is not None and hit[0] == (_mtime(found.path), dependencies):
                importable = not isinstance(hit[1], str)
                error = hit[1] if isinstance(hit[1], str) else None
        return EnvEntry(
            name=found.name,
            class_name=found.class_name,
            file_path=self._relative(found.path),
            description=found.description,
            importable=importable,
            error=error,
            path=found.path,
            framework=found.framework,
            generation=found.generation,
            dependencies=dependencies,
            folder=found.folder,
        )

    def _entry_for(self, entry: EnvEntry) -> EnvEntry:
        return EnvEntry(**{**entry.__dict__, "importable": True, "error": None})

    def _relative(self, path: Path) -> str:
        try:
            return str(path.relative_to(self._root))
        except ValueError:
            return str(path)


def _check_installed(entry: EnvEntry) -> None:
    """A verifiers environment is inspected and run once its own dependencies are in."""
    deps = entry.dependencies
    if deps is None or deps.state in ("none", "installed"):
        return
    if deps.state == "installing":
        raise Conflict(
            f"Environment '{entry.name}' is having its dependencies installed "
            f"({', '.join(deps.requirements)}); try again once GET /environments lists its "
            "dependencies as installed.",
            importable=None,
            error=None,
        )
    why = (deps.error or "").rstrip(".")
    raise Conflict(
        f"Environment '{entry.name}' cannot be used: its dependencies did not install: {why}. "
        f"Fix the dependencies in {entry.folder}/pyproject.toml (the verifiers interpreter's "
        "lock pins what it has: docs/verifiers.md).",
        importable=False,
        error=deps.error,
    )


def _fix(error: str, entry: EnvEntry) -> str:
    """What to do about an import failure: a missing package is installed, not fixed."""
    missing = error.startswith(("ModuleNotFoundError", "ImportError"))
    if missing and entry.folder is not None:  # verifiers: what it asks for is installed
        return (
            f"Add the package to the dependencies in {entry.folder}/pyproject.toml (they are "
            "installed into the verifiers interpreter: docs/verifiers.md), or fix "
            f"{entry.file_path}."
        )
    if missing and entry.framework != "rlcs":
        return (
            f"Install what it imports into the {entry.framework} interpreter "
            f"(docs/{entry.framework}.md), or fix {entry.file_path}."
        )
    return f"Fix {entry.file_path}."


def check_name(name: str) -> None:
    if len(name) > NAME_MAX or not NAME_PATTERN.match(name):
        raise InvalidValue(
            f"name: '{name[:80]}' is not a valid environment name; use letters, digits, "
            "'_', '-' or '.' (no path characters), as listed by GET /environments."
        )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0
