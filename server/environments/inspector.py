"""Environment code runs in inspector subprocesses, never in the server: `runners.inspector`
for ours, `runners/atropos/envside/inspect_env.py` in the Atropos interpreter for Atropos
environments, `runners/verifiers/envside/inspect_env.py` in the verifiers interpreter for
verifiers environments. One process per environment file version, each answer within a
deadline. A file whose import hangs, raises, exits or floods its output costs its own process
only."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core import procs
from core.atropos import offline_environment
from core.child import Child
from core.frameworks import FRAMEWORKS, Framework, load
from core.inspect_wire import (
    ANSWER,
    Described,
    Failed,
    InspectorAnswer,
    Invalid,
    Validate,
    Validated,
)
from core.settings import PROJECT_ROOT, Settings

log = logging.getLogger(__name__)
INSPECTOR_MODULE = "runners.inspector"
MAX_PROCESSES = 8  # environments inspected at once; the least recently used one is ended


class InspectFailed(Exception):
    """The file could not be imported or inspected; the message says what happened."""


class ConfigInvalid(Exception):
    """The environment's Config rejected the values; `errors` as pydantic lists them."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} validation errors")
        self.errors = errors


class Ask(Protocol):
    """Values to the inspector (`load`: and load the environment with them), its answer."""

    def __call__(self, values: dict[str, Any], load: bool = False) -> InspectorAnswer: ...


class CannotStart(Exception):
    """The environment does not load with these values, as a run would load it (says why)."""


@dataclass
class ConfigSchema:
    """What the server knows of an environment's Config, learnt from its inspector."""

    fields: frozenset[str]
    locked: frozenset[str]
    schema: dict[str, Any]
    defaults: dict[str, Any]
    _ask: Ask = field(repr=False)
    framework: Framework = "rlcs"

    def validate(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values as the Config validates and dumps them (strict); ConfigInvalid else."""
        match self._ask(values):
            case Validated(values=valid):
                return valid
            case Invalid(errors=errors):
                raise ConfigInvalid(errors)
            case Failed(error=error):
                raise InspectFailed(f"its Config's validation failed: {error}")
            case other:
                raise InspectFailed(f"its inspector answered a validation with {other.kind}")

    def locked_reason(self, name: str) -> str:
        """Why a locked field cannot be edited (for the 4xx that refuses an edit)."""
        return "the server derives it (it follows model_name)"

    def check_starts(self, values: dict[str, Any]) -> None:
        """CannotStart when a run with these (validated) values could not start. Ours and
        Atropos's are loaded by the run itself; a verifiers environment is tried here."""


@dataclass
class InspectorCommand:
    """How to start an inspector: its argv, folder and environment variables."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]

    @classmethod
    def for_file(
        cls, settings: Settings, path: Path, class_name: str, framework: Framework
    ) -> InspectorCommand:
        env = settings.inspector_environment()
        entry = FRAMEWORKS[framework]
        python, script = entry.python(settings), entry.inspect_script
        if script is None:
            argv = [python, "-m", INSPECTOR_MODULE, str(path), class_name]
            return cls(argv, PROJECT_ROOT, env)
        if not Path(python).is_file():
            raise InspectFailed(
                f"it is an {framework} environment, and its interpreter {python} does not "
                f"exist: run `make install`, or point {entry.python_needs}"
            )
        # By path in the framework's interpreter, in the file's folder, as it runs there.
        argv = [python, str(script), str(path), class_name]
        # Its stdlib loop watches the server by pid (it reads input only between requests).
        parent = {procs.PARENT_PID_VARIABLE: str(os.getpid())}
        return cls(argv, path.parent, {**offline_environment(env), **parent})


class InspectorProcess:
    """One inspector process (`python -m runners.inspector FILE CLASS`, or the Atropos one):
    started, asked, ended. Its stderr goes nowhere: a flood of output must not fill a pipe
    nobody reads, nor a log."""

    def __init__(self, settings: Settings, command: InspectorCommand) -> None:
        self.timeout_s = settings.inspect_timeout_s
        self._lock = threading.Lock()
        self._child = Child(
            "its inspector process", command.argv, ANSWER, cwd=command.cwd, env=command.env
        )

    def first_answer(self) -> InspectorAnswer:
        with self._lock:
            return self._wait("importing it")

    def ask(self, values: dict[str, Any], load: bool = False) -> InspectorAnswer:
        with self._lock:
            if not self._child.send(Validate(values=values, load=load)):
                self.close()
                raise InspectFailed("its inspector process is gone; try again")
            return self._wait("loading the environment" if load else "validating a config")

    def _wait(self, doing: str) -> InspectorAnswer:
        try:
            answer = self._child.receive(self.timeout_s)
        except TimeoutError:
            self.close()
            raise InspectFailed(
                f"{doing} did not finish within {self.timeout_s:g} s (RLCS_INSPECT_TIMEOUT_S); "
                "its inspector process was stopped. Look for code that blocks at import time "
                "(a network call, input(), an endless loop)"
            ) from None
        if answer is None:
            raise InspectFailed(
                f"its process ended while {doing} ({self._child.exit_status()}): the file "
                "exits or crashes the interpreter at import (os._exit, a fatal signal)"
            )
        return answer

    @property
    def alive(self) -> bool:
        return self._child.alive

    def close(self) -> None:
        self._child.kill()  # it and anything it started


Key = tuple[Path, str, float, Framework]  # file, class, mtime, framework
Describe = Callable[[Described, Ask], ConfigSchema]


def describe_ours(first: Described, ask: Ask) -> ConfigSchema:
    return ConfigSchema(
        fields=frozenset(first.fields),
        locked=frozenset(first.locked),
        schema=first.config_schema,
        defaults=first.defaults,
        _ask=ask,
    )


class Inspectors:
    """Inspector processes by (file, class, mtime), at most MAX_PROCESSES alive; one that was
    ended (evicted, timed out, crashed) is started again when next asked. Each framework's
    describer (core.frameworks) turns its inspector's first answer into the config shown."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._alive: OrderedDict[Key, InspectorProcess] = OrderedDict()

    def inspect(
        self, path: Path, class_name: str, mtime: float, framework: Framework = "rlcs"
    ) -> ConfigSchema:
        """Import the file in an inspector and describe its Config; InspectFailed else."""
        key = (path, class_name, mtime, framework)
        # By path: another framework's describer module imports this one.
        describe: Describe = load(FRAMEWORKS[framework].describe)
        process, first = self._start(key)
        self._keep(key, process)

        def ask(values: dict[str, Any], load: bool = False) -> InspectorAnswer:
            return self._ask(key, values, load)

        return describe(first, ask)

    def _start(self, key: Key) -> tuple[InspectorProcess, Described]:
        command = InspectorCommand.for_file(self._settings, key[0], key[1], key[3])
        process = InspectorProcess(self._settings, command)
        try:
            first = process.first_answer()
        except InspectFailed:
            process.close()
            raise
        if not isinstance(first, Described):
            process.close()
            error = first.error if isinstance(first, Failed) else f"it began with {first.kind}"
            raise InspectFailed(error)
        return process, first

    def _keep(self, key: Key, process: InspectorProcess) -> None:
        with self._lock:
            old = [self._alive.pop(k) for k in list(self._alive) if k[:2] == key[:2]]
            self._alive[key] = process
            while len(self._alive) > MAX_PROCESSES:
                old.append(self._alive.popitem(last=False)[1])
        for proc in old:
            if proc is not process:
                proc.close()

    def _ask(self, key: Key, values: dict[str, Any], load: bool = False) -> InspectorAnswer:
        with self._lock:
            process = self._alive.get(key)
            if process is not None:
                self._alive.move_to_end(key)
        if process is None or not process.alive:
            process = self._start(key)[0]
            self._keep(key, process)
        return process.ask(values, load)

    def close(self) -> None:
        with self._lock:
            old = list(self._alive.values())
            self._alive.clear()
        for proc in old:
            proc.close()
