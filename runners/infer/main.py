"""The inference client: `python -m runners.infer`, started by the server on first need and
started again after it dies. Environment code of a test inference (an environment's file, an
Atropos or verifiers environment's interpreter) runs here, out of the engine hosts that every
run's models live in: an environment that exits, leaks or spins takes this process down, not a
host. It samples from the host placed for each job's model, as a run does.

Protocol (core.infer_wire, over core.child's LineChannel): one job per line in, its answer out;
a cancel stops that job's sampling at the next decode step (the host is told). It exits the
moment its input closes, busy or not: the server is gone, however it died, and its connections
to the hosts close with it (the hosts stop its samples). What a library prints goes to the log.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback

from pydantic import ValidationError

from core.child import LineChannel
from core.infer_wire import TO_WORKER, Cancel, Done, Job, ToWorker, error_answer
from core.settings import Settings
from core.spec import InferenceJob
from runners.backends.cancel import CancelEvent
from runners.infer.worker import Worker

log = logging.getLogger("infer")


class Inbox:
    """The client's input, read on core.child's reading thread, so that a cancel or the end of
    input is seen even mid-job: jobs queue up for the event loop (a line that is not one, as
    its error), each with its cancel event made on arrival; a cancel sets its job's event at
    once (a cancel of a job already answered finds none: it is moot)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.jobs: asyncio.Queue[Job | ValidationError] = asyncio.Queue()
        self._cancels: dict[int, CancelEvent] = {}
        self._lock = threading.Lock()

    def take(self, message: ToWorker) -> None:
        match message:
            case Cancel(id=job_id):
                with self._lock:
                    event = self._cancels.get(job_id)
                if event is not None:
                    log.info("job %s cancelled by the server", job_id)
                    event.set()
            case Job(id=job_id):
                self.cancel_event(job_id)
                self._loop.call_soon_threadsafe(self.jobs.put_nowait, message)

    def not_a_job(self, _line: str, error: ValidationError) -> None:
        self._loop.call_soon_threadsafe(self.jobs.put_nowait, error)

    def cancel_event(self, job_id: int) -> CancelEvent:
        with self._lock:
            return self._cancels.setdefault(job_id, CancelEvent())

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._cancels.pop(job_id, None)


async def serve(worker: Worker, channel: LineChannel) -> None:
    """Each job in a task of its own, so that concurrent requests reach the host together (it
    decodes them as one batch); answers go out as each finishes, by job id."""
    inbox = Inbox(asyncio.get_running_loop())
    channel.serve_lines_in_background(TO_WORKER, inbox.take, inbox.not_a_job)
    running: set[asyncio.Task[None]] = set()
    while True:
        item = await inbox.jobs.get()
        if isinstance(item, ValidationError):
            channel.send(Done(id=None, body=error_answer(item)))
            continue
        task = asyncio.create_task(answer(worker, channel, inbox, item))
        running.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(running.discard)


async def answer(worker: Worker, channel: LineChannel, inbox: Inbox, item: Job) -> None:
    try:
        if not isinstance(item.job, InferenceJob):
            raise ValueError(f"the inference client answers test inference, not {item.job.op}")
        body = await worker.handle(item.job, inbox.cancel_event(item.id))
    except Exception as exc:
        log.error("job %s failed:\n%s", item.id, traceback.format_exc())
        body = error_answer(exc)
    finally:
        inbox.forget(item.id)
    channel.send(Done(id=item.id, body=body))


def main() -> int:
    channel = LineChannel(prints="log")  # a library's print lands in the log, not the protocol
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve(Worker(Settings()), channel))
    return 0
