"""The Tinker worker process as the server sees it: `python -m runners.tinker_worker`, started on
first use (core.child: a process group of its own, its stderr in var/tinker-worker.log), ended
with the server (closing its input ends it, even after the server is killed: no leftovers),
started afresh after it dies.

Each request (core.tinker_wire) gets an acknowledgement, awaited by the POST that sent it, and
once accepted its answer later, handed to the request's `on_answer` on the event loop; if the
worker dies first, `on_answer` gets a `Failed` (category server) in its place.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import procs
from core.child import Child
from core.settings import PROJECT_ROOT, Settings
from core.tinker_wire import REPLY, Accepted, Answer, Done, Failed, Op, Ready, Refused, Reply
from server.errors import Unavailable

log = logging.getLogger(__name__)
OnAnswer = Callable[[Answer, float], None]  # the answer, and how long it ran (s)
ACK_TIMEOUT_S = 300.0  # a first request waits for the worker to start (imports, a model load)


@dataclass(frozen=True)
class Refusal:
    """The worker would not take a request: the HTTP status and why."""

    status: int
    detail: str


@dataclass(eq=False)
class _Running:
    """One worker process and the requests it owes an acknowledgement or an answer."""

    child: Child[Reply] | None = None
    acks: dict[int, asyncio.Future[Refusal | None]] = field(default_factory=dict)
    answers: dict[int, OnAnswer] = field(default_factory=dict)


class TinkerWorkerProcess:
    def __init__(self, settings: Settings, on_exit: Callable[[str], None]) -> None:
        self._settings = settings
        self._on_exit = on_exit  # told (on the event loop) when a worker died
        self._running: _Running | None = None
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.starts = 0
        self.log_path: Path = settings.var_dir / "tinker-worker.log"

    @property
    def pid(self) -> int | None:
        running = self._running
        child = running.child if running is not None else None
        return child.pid if child is not None and child.alive else None

    async def call(self, request: Op[Any], on_answer: OnAnswer | None = None) -> Refusal | None:
        """Send one request; once acknowledged, None or why it was refused. `on_answer` gets
        its answer later (a refused request has none)."""
        self._loop = asyncio.get_running_loop()
        running, child = self._ensure_started()
        request = request.model_copy(update={"id": next(self._ids)})
        ack: asyncio.Future[Refusal | None] = self._loop.create_future()
        running.acks[request.id] = ack
        if on_answer is not None:
            running.answers[request.id] = on_answer  # before sending: it may come back at once
        try:
            # A large body may fill the pipe until the worker reads it: not on the event loop.
            if not await asyncio.to_thread(child.send, request):
                raise Unavailable(self._died(child, "it exited before taking the request"))
            refusal = await asyncio.wait_for(asyncio.shield(ack), ACK_TIMEOUT_S)
        except TimeoutError:
            running.answers.pop(request.id, None)
            raise Unavailable(
                f"the Tinker worker did not take the request within {ACK_TIMEOUT_S:.0f} s; "
                f"see {self.log_path}"
            ) from None
        except BaseException:
            running.answers.pop(request.id, None)
            raise
        finally:
            running.acks.pop(request.id, None)
        if refusal is not None:
            running.answers.pop(request.id, None)
        return refusal

    def stop(self) -> None:
        """End the worker (closing its input ends it at once); its group is killed if it
        lingers."""
        self._closed = True
        running, self._running = self._running, None
        if running is not None and running.child is not None:
            running.child.stop()

    # The process -------------------------------------------------------------------------

    def _ensure_started(self) -> tuple[_Running, Child[Reply]]:
        if self._closed:
            raise Unavailable("the server is shutting down; the Tinker worker is stopped")
        running = self._running
        if running is not None and running.child is not None and running.child.alive:
            return running, running.child
        env = self._settings.child_environment()
        env["RLCS_TINKER_MEMORY_BUDGET_GB"] = str(self._settings.tinker_memory_budget_gb)
        running = _Running()
        child = Child(
            "the Tinker worker",
            [self._settings.python_executable, "-m", self._settings.tinker_worker_module],
            REPLY,
            cwd=PROJECT_ROOT,
            env=env,
            log_path=self.log_path,
            on_message=lambda reply: self._hand_over(self._dispatch, running, reply),
            on_end=lambda code: self._hand_over(self._exited, running, code),
        )
        running.child = child
        self._running = running
        self.starts += 1
        log.info("started the Tinker worker (pid %s)", child.pid)
        return running, child

    def _hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        """From the reading thread to the event loop, in order."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed meanwhile (server shutdown)
                pass

    def _dispatch(self, running: _Running, reply: Reply) -> None:
        match reply:
            case Accepted(id=request_id):
                _settle(running.acks.get(request_id), None)
            case Refused(id=request_id, status=status, detail=detail) if request_id is not None:
                _settle(running.acks.get(request_id), Refusal(status, detail))
            case Done(id=request_id, answer=answer, run_s=run_s):
                on_answer = running.answers.pop(request_id, None)
                if on_answer is not None:
                    on_answer(answer, run_s)
            case Ready(pid=pid):
                log.info("the Tinker worker (pid %s) is ready", pid)
            case Refused(detail=detail):
                log.warning("the Tinker worker refused a line that was not a request: %s", detail)

    def _exited(self, running: _Running, code: int) -> None:
        assert running.child is not None
        why = self._died(running.child, f"it exited ({procs.describe_exit(code)})")
        if not self._closed:
            log.warning("%s", why)
        if self._running is running:
            self._running = None
        for ack in running.acks.values():
            _settle(ack, Refusal(503, why))
        answers, running.answers = running.answers, {}
        for on_answer in answers.values():
            on_answer(Failed(error=why, category="server"), 0.0)
        self._on_exit(why)

    def _died(self, child: Child[Reply], when: str) -> str:
        if self._closed:
            return "the server is shutting down; the Tinker worker was stopped"
        return child.failure(when)


def _settle(ack: asyncio.Future[Refusal | None] | None, refusal: Refusal | None) -> None:
    if ack is not None and not ack.done():
        ack.set_result(refusal)
