"""Chat completions and warm-ups in the engine host: the jobs of core.infer_wire (from the
server's /v1) it answers itself (jobs.py), each in a task of one event loop on a thread of its
own, so that concurrent requests reach the engine together (it decodes them as one batch);
answers go back to the connection that asked, by its job id. A cancel, or the client's going,
stops a job's sampling at the next decode step. A test inference scored by an environment is
not served here (environment code runs in the inference client, runners/infer).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from typing import Any, Protocol

from core.engine_wire import InferReply
from core.infer_wire import Cancel, Done, Job, Partial, ToWorker, error_answer
from core.settings import Settings
from core.spec import InferenceJob
from runners.engine.local import LocalServiceClient
from runners.engine_host.jobs import ChatJobs

log = logging.getLogger("engine-host.inference")


class Connection(Protocol):
    """The client a job came from: where its answer goes."""

    @property
    def name(self) -> str: ...

    def send_infer(self, message: InferReply) -> None: ...


class InferenceLoop:
    def __init__(self, settings: Settings, service: LocalServiceClient) -> None:
        self._settings = settings
        self._service = service
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._cancels: dict[tuple[int, int], threading.Event] = {}  # (connection, job id)
        self._tasks: set[asyncio.Task[None]] = set()
        self._jobs: ChatJobs | None = None  # made on the loop's thread, at its first job
        threading.Thread(target=self._loop.run_forever, daemon=True, name="inference").start()

    def take(self, connection: Connection, message: ToWorker) -> None:
        key = (id(connection), message.id)
        match message:
            case Cancel():
                with self._lock:
                    event = self._cancels.get(key)
                if event is not None:
                    log.info("job %s of %s cancelled", message.id, connection.name)
                    event.set()
            case Job():
                with self._lock:
                    cancel = self._cancels.setdefault(key, threading.Event())
                self._loop.call_soon_threadsafe(self._start, connection, message, cancel)

    def jobs_of(self, connection: Connection) -> int:
        with self._lock:
            return sum(1 for owner, _ in self._cancels if owner == id(connection))

    def cancel_all(self, connection: Connection) -> None:
        """The client is gone: its jobs stop at their next decode step, unanswered."""
        with self._lock:
            for (owner, _), event in self._cancels.items():
                if owner == id(connection):
                    event.set()

    def _start(self, connection: Connection, job: Job, cancel: threading.Event) -> None:
        task = self._loop.create_task(self._answer(connection, job, cancel))
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, connection: Connection, job: Job, cancel: threading.Event) -> None:
        if self._jobs is None:
            self._jobs = ChatJobs(self._settings, self._service)
        body: dict[str, Any]
        try:

            def emit(index: int, delta: str) -> None:
                connection.send_infer(
                    InferReply(message=Partial(id=job.id, index=index, delta=delta))
                )

            if isinstance(job.job, InferenceJob):
                raise ValueError(
                    "an engine host runs no environment code: test inference goes to the "
                    "inference client (runners.infer)"
                )
            body = await self._jobs.handle(job.job, cancel, emit)
        except Exception as exc:
            log.error("job %s of %s failed:\n%s", job.id, connection.name, traceback.format_exc())
            body = error_answer(exc)
        finally:
            with self._lock:
                self._cancels.pop((id(connection), job.id), None)
        connection.send_infer(InferReply(message=Done(id=job.id, body=body)))
