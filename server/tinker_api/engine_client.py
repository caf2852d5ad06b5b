"""The Tinker engine process as the server sees it: `python -m runners.tinker_engine`, started
on first use in a process group of its own, ended with the server (closing its stdin ends
it, even after the server is killed: no leftovers), started afresh after it dies.

JSON lines both ways (server.line_pipe's way, as with the inference worker): the requests of
a server and one child need no port or socket file, and the pipe ties the engine's life to
the server's. Each request gets an acknowledgement (awaited by the POST that sent it) and,
for those that are futures, an answer later (handed to `on_answer`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import procs
from core.run_folder import tail_lines
from core.settings import PROJECT_ROOT, Settings
from server.errors import Unavailable

log = logging.getLogger(__name__)
Message = dict[str, Any]
ACK_TIMEOUT_S = 300.0  # a first request waits for the engine to start (imports, a model load)


@dataclass(frozen=True)
class Refusal:
    """The engine would not take a request: the HTTP status and why."""

    status: int
    detail: str


class EngineProcess:
    def __init__(
        self,
        settings: Settings,
        on_answer: Callable[[int, Message], None],
        on_exit: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._on_answer = on_answer
        self._on_exit = on_exit
        self._proc: subprocess.Popen[str] | None = None
        self._write_lock = threading.Lock()
        self._acks: dict[int, asyncio.Future[Refusal | None]] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "tinker-engine.log"

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    async def call(self, op: str, **fields: Any) -> tuple[int, Refusal | None]:
        """Send one request; its id and, once acknowledged, None or why it was refused."""
        self._loop = asyncio.get_running_loop()
        proc = self._ensure_started()
        message_id = next(self._ids)
        ack: asyncio.Future[Refusal | None] = self._loop.create_future()
        self._acks[message_id] = ack
        line = json.dumps({"id": message_id, "op": op, **fields}, separators=(",", ":"))
        # A large body may fill the pipe until the engine reads it: not on the event loop.
        sent = await asyncio.to_thread(self._write, proc, line)
        if not sent:
            self._acks.pop(message_id, None)
            raise Unavailable(self._died("it exited before taking the request"))
        try:
            return message_id, await asyncio.wait_for(asyncio.shield(ack), ACK_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(
                f"the Tinker engine did not take the request within {ACK_TIMEOUT_S:.0f} s; "
                f"see {self.log_path}"
            ) from None
        finally:
            self._acks.pop(message_id, None)

    def stop(self) -> None:
        """End the engine (closing its stdin ends it at once); its group is killed if it
        lingers."""
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc)

    # The process -------------------------------------------------------------------------

    def _ensure_started(self) -> subprocess.Popen[str]:
        if self._closed:
            raise Unavailable("the server is shutting down; the Tinker engine is stopped")
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
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
        self._proc = proc
        self.starts += 1
        log.info("started the Tinker engine (pid %s)", proc.pid)
        threading.Thread(
            target=self._read, args=(proc,), daemon=True, name="tinker-engine-read"
        ).start()
        return proc

    def _write(self, proc: subprocess.Popen[str], line: str) -> bool:
        assert proc.stdin is not None
        with self._write_lock:
            try:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return False
        return True

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("the Tinker engine wrote a line that is not JSON: %.200s", line)
                    continue
                self._hand_over(self._dispatch, message)
        code = proc.wait()
        if proc is self._proc or self._proc is None:
            why = self._died(f"it exited ({procs.describe_exit(code)})")
            if not self._closed:
                log.warning("%s", why)
            self._hand_over(self._exited, proc, why)

    def _hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile (server shutdown)
                pass

    def _dispatch(self, message: Message) -> None:
        message_id = message.get("id")
        if "ack" in message:
            ack = self._acks.get(message_id)  # type: ignore[arg-type]
            if ack is not None and not ack.done():
                refusal = None
                if not message["ack"]:
                    refusal = Refusal(int(message.get("status", 500)), str(message["detail"]))
                ack.set_result(refusal)
        elif message.get("done"):
            self._on_answer(int(message_id), message)  # type: ignore[arg-type]

    def _exited(self, proc: subprocess.Popen[str], why: str) -> None:
        if self._proc is proc:
            self._proc = None
        for ack in self._acks.values():
            if not ack.done():
                ack.set_result(Refusal(503, why))
        self._acks.clear()
        self._on_exit(why)

    def _died(self, when: str) -> str:
        if self._closed:
            return "the server is shutting down; the Tinker engine was stopped"
        tail = "\n".join(tail_lines(self.log_path, 10))
        return f"the Tinker engine failed: {when}. Last lines of its log:\n{tail}"


def _end(proc: subprocess.Popen[str]) -> None:
    """Close the engine's input (it exits on end of input); kill its group if it lingers."""
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        procs.signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
