"""The Tinker engine process as the server sees it: `python -m runners.tinker_engine`, started
on first use in a process group of its own, ended with the server (closing its stdin ends
it, even after the server is killed: no leftovers), started afresh after it dies.

JSON lines both ways (server.line_pipe's way, as with the inference worker): the requests of
a server and one child need no port or socket file, and the pipe ties the engine's life to
the server's. Each request gets an acknowledgement (awaited by the POST that sent it) and,
for those that are futures, an answer later (handed to the request's `answer` callback, on
the event loop; if the engine dies first, the callback gets an error in its place).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import procs
from core.settings import PROJECT_ROOT, Settings
from server.errors import Unavailable
from server.line_pipe import died_message, end_child

log = logging.getLogger(__name__)
Message = dict[str, Any]
Answer = Callable[[Message], None]
ACK_TIMEOUT_S = 300.0  # a first request waits for the engine to start (imports, a model load)


@dataclass(frozen=True)
class Refusal:
    """The engine would not take a request: the HTTP status and why."""

    status: int
    detail: str


@dataclass(eq=False)
class _Child:
    """One engine process and the requests it owes an acknowledgement or an answer."""

    proc: subprocess.Popen[str]
    acks: dict[int, asyncio.Future[Refusal | None]] = field(default_factory=dict)
    answers: dict[int, Answer] = field(default_factory=dict)


class EngineProcess:
    def __init__(self, settings: Settings, on_exit: Callable[[str], None]) -> None:
        self._settings = settings
        self._on_exit = on_exit  # told (on the event loop) when an engine died
        self._child: _Child | None = None
        self._write_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "tinker-engine.log"

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.proc.pid if child is not None and child.proc.poll() is None else None

    async def call(self, op: str, answer: Answer | None = None, **fields: Any) -> Refusal | None:
        """Send one request; once acknowledged, None or why it was refused. `answer` gets
        the request's answer later (a refused request has none)."""
        self._loop = asyncio.get_running_loop()
        child = self._ensure_started()
        message_id = next(self._ids)
        ack: asyncio.Future[Refusal | None] = self._loop.create_future()
        child.acks[message_id] = ack
        if answer is not None:
            child.answers[message_id] = answer  # before sending: it may come back at once
        line = json.dumps({"id": message_id, "op": op, **fields}, separators=(",", ":"))
        try:
            # A large body may fill the pipe until the engine reads it: not on the event loop.
            if not await asyncio.to_thread(self._write, child.proc, line):
                raise Unavailable(self._died("it exited before taking the request"))
            refusal = await asyncio.wait_for(asyncio.shield(ack), ACK_TIMEOUT_S)
        except TimeoutError:
            child.answers.pop(message_id, None)
            raise Unavailable(
                f"the Tinker engine did not take the request within {ACK_TIMEOUT_S:.0f} s; "
                f"see {self.log_path}"
            ) from None
        except BaseException:
            child.answers.pop(message_id, None)
            raise
        finally:
            child.acks.pop(message_id, None)
        if refusal is not None:
            child.answers.pop(message_id, None)
        return refusal

    def stop(self) -> None:
        """End the engine (closing its stdin ends it at once); its group is killed if it
        lingers."""
        self._closed = True
        child, self._child = self._child, None
        if child is not None:
            end_child(child.proc)

    # The process -------------------------------------------------------------------------

    def _ensure_started(self) -> _Child:
        if self._closed:
            raise Unavailable("the server is shutting down; the Tinker engine is stopped")
        child = self._child
        if child is not None and child.proc.poll() is None:
            return child
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self._settings.child_environment()
        env["RLCS_TINKER_MEMORY_BUDGET_GB"] = str(self._settings.tinker_memory_budget_gb)
        with self.log_path.open("a") as log_file:
            proc = subprocess.Popen(
                [self._settings.python_executable, "-m", self._settings.tinker_engine_module],
                cwd=PROJECT_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                env=env,
                start_new_session=True,
            )
        child = _Child(proc)
        self._child = child
        self.starts += 1
        log.info("started the Tinker engine (pid %s)", proc.pid)
        threading.Thread(
            target=self._read, args=(child,), daemon=True, name="tinker-engine-read"
        ).start()
        return child

    def _write(self, proc: subprocess.Popen[str], line: str) -> bool:
        assert proc.stdin is not None
        with self._write_lock:
            try:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return False
        return True

    def _read(self, child: _Child) -> None:
        """The child's output lines, handed to the event loop in order; then its end."""
        assert child.proc.stdout is not None
        with child.proc.stdout:
            for line in child.proc.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("the Tinker engine wrote a line that is not JSON: %.200s", line)
                    continue
                self._hand_over(self._dispatch, child, message)
        code = child.proc.wait()
        why = self._died(f"it exited ({procs.describe_exit(code)})")
        if not self._closed:
            log.warning("%s", why)
        self._hand_over(self._exited, child, why)

    def _hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile (server shutdown)
                pass

    def _dispatch(self, child: _Child, message: Message) -> None:
        message_id = message.get("id")
        if not isinstance(message_id, int):
            return  # the "ready" line
        if "ack" in message:
            ack = child.acks.get(message_id)
            if ack is not None and not ack.done():
                refusal = None
                if not message["ack"]:
                    refusal = Refusal(int(message.get("status", 500)), str(message["detail"]))
                ack.set_result(refusal)
        elif message.get("done"):
            answer = child.answers.pop(message_id, None)
            if answer is not None:
                answer(message)

    def _exited(self, child: _Child, why: str) -> None:
        if self._child is child:
            self._child = None
        for ack in child.acks.values():
            if not ack.done():
                ack.set_result(Refusal(503, why))
        answers, child.answers = child.answers, {}
        for answer in answers.values():
            answer({"done": True, "error": why, "category": "server"})
        self._on_exit(why)

    def _died(self, when: str) -> str:
        return died_message("the Tinker engine", when, self.log_path, self._closed)
