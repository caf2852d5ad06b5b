"""A training client's worker (runners/engine/train/turns.py): clients on one base take turns by
whole steps (a step's requests queued back to back run in one hold of the lock), a request
that needs no lock never waits for another client's turn, a turn yields after MAX_TURN
requests, and a worker shut down mid-turn leaves the lock free. Real threads and the real
FairLock, synchronised on events."""

from __future__ import annotations

import threading

from runners.engine.fair_lock import FairLock
from runners.engine.train.turns import MAX_TURN, Hold, TurnWorker
from tests.support.helpers import wait_for


class Log:
    def __init__(self) -> None:
        self.entries: list[str] = []
        self._lock = threading.Lock()

    def note(self, entry: str) -> str:
        with self._lock:
            self.entries.append(entry)
        return entry


def test_two_clients_take_turns_by_whole_steps() -> None:
    lock, log, go = FairLock(), Log(), threading.Event()
    a, b = TurnWorker(lock), TurnWorker(lock)
    first = a.submit(Hold.MODEL, lambda: go.wait(10) and log.note("a forward_backward"))
    a_optim = a.submit(Hold.STEP_END, log.note, "a optim_step")
    wait_for(first.running, 10)  # a holds the lock
    b.submit(Hold.MODEL, log.note, "b forward_backward")
    b_optim = b.submit(Hold.STEP_END, log.note, "b optim_step")
    wait_for(lambda: lock.waiting() == 1, 10)  # b waits while a's first request runs
    go.set()
    first.result(10), a_optim.result(10), b_optim.result(10)
    assert log.entries == [
        "a forward_backward",
        "a optim_step",  # a's step whole, though b asked for the lock before a's optim_step
        "b forward_backward",
        "b optim_step",
    ]
    a.shutdown(), b.shutdown()


def test_a_request_that_needs_no_lock_does_not_wait_for_another_turn() -> None:
    lock, go = FairLock(), threading.Event()
    a, b = TurnWorker(lock), TurnWorker(lock)
    holding = a.submit(Hold.MODEL, go.wait, 10)
    wait_for(holding.running, 10)
    assert b.submit(Hold.NONE, lambda: "snapshot").result(10) == "snapshot"
    assert not holding.done()  # a still holds its turn
    go.set()
    holding.result(10)
    a.shutdown(), b.shutdown()


def test_a_turn_yields_after_max_turn_requests() -> None:
    lock, log, go = FairLock(), Log(), threading.Event()
    a, b = TurnWorker(lock), TurnWorker(lock)
    first = a.submit(Hold.MODEL, go.wait, 10)
    many = [a.submit(Hold.MODEL, log.note, f"a{i}") for i in range(1, MAX_TURN + 2)]
    wait_for(first.running, 10)  # a holds the lock
    other = b.submit(Hold.MODEL, log.note, "b")
    wait_for(lambda: lock.waiting() == 1, 10)
    go.set()
    other.result(10), many[-1].result(10)
    assert log.entries.index("b") == MAX_TURN - 1  # after a's first MAX_TURN requests
    a.shutdown(), b.shutdown()


def test_a_worker_shut_down_mid_turn_leaves_the_lock_free() -> None:
    lock, go = FairLock(), threading.Event()
    a = TurnWorker(lock)
    running = a.submit(Hold.MODEL, go.wait, 10)
    never = a.submit(Hold.STEP_END, lambda: "never")
    wait_for(running.running, 10)
    a.shutdown(wait=False, cancel_futures=True)  # while `running` holds the turn
    go.set()
    a.shutdown()  # waits for the worker to end
    assert running.done() and not never.done()  # cancelled: it never ran
    assert lock.acquire()  # free (here, in this thread)
    lock.release()
    b = TurnWorker(lock)
    assert b.submit(Hold.STEP_END, lambda: "ran").result(10) == "ran"
    b.shutdown()
