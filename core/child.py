"""A child process that speaks one JSON message per line on its stdin and stdout, both ends:
`Child` for the process that starts it (a `core.process.Process`), `LineChannel` in the child.
Every message is a pydantic model of its protocol (`core.tinker_wire`, `core.infer_wire`,
`core.inspect_wire`), validated when it is read; the pipes tie the child's life to its owner's
(end of input ends it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Generic, Literal, NoReturn, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from core.process import Process

log = logging.getLogger(__name__)
In = TypeVar("In")
STOP_GRACE_S = 5.0  # a child whose input closed and is still there after this is killed


class Child(Process, Generic[In]):
    """One child process as its owner sees it, started at once in a process group of its own
    (so that ending it ends whatever it started): messages to its stdin, one per line; its
    stdout read by a thread, each line validated as `reads` and either handed to `on_message`
    on that thread or queued for `receive`; its stderr appended to `log_path` (None throws it
    away: a child whose code is not ours may flood it). Once its output ends, `on_end` gets its
    exit code (on the reading thread), or `receive` answers None. A line that is not its
    protocol's is logged, and handed to `on_invalid` (with why) where the owner must not wait
    on for an answer that will never come."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        reads: TypeAdapter[In],
        *,
        cwd: Path,
        env: Mapping[str, str],
        log_path: Path | None = None,
        on_message: Callable[[In], None] | None = None,
        on_end: Callable[[int], None] | None = None,
        on_invalid: Callable[[str], None] | None = None,
    ) -> None:
        self._reads = reads
        self._on_message = on_message
        self._on_end = on_end
        self._on_invalid = on_invalid
        self._lines: queue.Queue[In | None] = queue.Queue()
        self._write_lock = threading.Lock()
        with contextlib.ExitStack() as files:
            err: IO[str] | int = subprocess.DEVNULL
            if log_path is not None:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                err = files.enter_context(log_path.open("a"))
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                encoding="utf-8",
                env=dict(env),
                start_new_session=True,
            )
        super().__init__(name, proc, log_path)  # name: "the inference worker", for errors
        threading.Thread(target=self._read, daemon=True, name=f"{name} read").start()

    def send(self, message: BaseModel) -> bool:
        """One message, from any thread; False when the child's input is gone (it died). A
        large message blocks until the child reads it: keep it off an event loop."""
        line = message.model_dump_json() + "\n"
        assert self._proc.stdin is not None
        with self._write_lock:
            try:
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return False
        return True

    def receive(self, timeout: float | None = None) -> In | None:
        """The next message (without `on_message`), waiting up to `timeout`; None once the
        child's output ended. TimeoutError when nothing came in time."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} sent nothing within {timeout} s") from None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Close its input (a child of this kit exits at once on end of input); kill its
        group if it is still there after `grace_s`."""
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=grace_s)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        """SIGKILL to its group now: it and anything it started; then its input closed."""
        super().kill()
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        except (OSError, ValueError):
            pass

    def exit_status(self, wait_s: float = STOP_GRACE_S) -> str:
        """How it ended, in words, waiting a moment for a child whose output ended before it
        exited."""
        return super().exit_status(wait_s)

    def _read(self) -> None:
        out = self._proc.stdout
        assert out is not None
        with out:
            for line in out:
                try:
                    message = self._reads.validate_json(line)
                except ValidationError as exc:
                    why = (
                        f"{self.name} wrote a line that is not its protocol's ({_first_error(exc)})"
                    )
                    log.warning("%s: %.200s", why, line)
                    if self._on_invalid is not None:
                        self._on_invalid(why)
                    continue
                if self._on_message is None:
                    self._lines.put(message)
                    continue
                try:
                    self._on_message(message)
                except Exception:  # the reading must go on: its end is what reports a death
                    log.exception("%s: handling a message failed", self.name)
        self._lines.put(None)  # end of output: the child is gone, or going
        if self._on_end is not None:
            self._on_end(self._proc.wait())


class LineChannel:
    """The child's end: its protocol on private copies of stdin and stdout, so that nothing
    else in the process (a library's print, an environment's input()) can touch it. File
    descriptor 1 then goes to stderr (`prints="log"`) or nowhere (`prints="nowhere"`, for code
    that may flood it), and 0 reads nothing."""

    def __init__(self, prints: Literal["log", "nowhere"] = "log") -> None:
        self._out: IO[str] = os.fdopen(os.dup(1), "w", encoding="utf-8")
        self._in: IO[str] = os.fdopen(os.dup(0), "r", encoding="utf-8")
        _point(1, 2 if prints == "log" else _devnull(os.O_WRONLY))
        _point(0, _devnull(os.O_RDONLY))
        if prints == "log":
            sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, message: BaseModel) -> None:
        """One message, from any thread. A parent that no longer reads is gone: so is this
        process, at once (nobody is left to want its answers)."""
        line = message.model_dump_json() + "\n"
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                _exit("its parent stopped reading")

    def serve_lines(
        self,
        reads: TypeAdapter[In],
        handle: Callable[[In], None],
        invalid: Callable[[str, ValidationError], None] | None = None,
    ) -> NoReturn:
        """Each input line, validated as `reads`, to `handle` on this thread (a line that is
        not one goes to `invalid`, or is logged); at end of input the process ends at once,
        busy or not: its parent closed our input or died, however it died."""
        for line in self._in:
            if not line.strip():
                continue
            try:
                message = reads.validate_json(line)
            except ValidationError as exc:
                if invalid is None:
                    log.warning(
                        "a line that is not a request (%s): %.200s", _first_error(exc), line
                    )
                else:
                    invalid(line, exc)
                continue
            handle(message)
        _exit("end of input: the parent is gone or done with us")

    def serve_lines_in_background(
        self,
        reads: TypeAdapter[In],
        handle: Callable[[In], None],
        invalid: Callable[[str, ValidationError], None] | None = None,
    ) -> None:
        """`serve_lines` on a thread of its own, so that the end of input is seen whatever
        the main thread does (an import that never returns, an event loop)."""
        threading.Thread(
            target=self.serve_lines, args=(reads, handle, invalid), daemon=True, name="lines in"
        ).start()


def _exit(why: str) -> NoReturn:
    log.info("%s; exiting", why)
    logging.shutdown()
    os._exit(0)


def _point(fd: int, target: int) -> None:
    os.dup2(target, fd)
    if target > 2:
        os.close(target)


def _devnull(flags: int) -> int:
    return os.open(os.devnull, flags)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])
