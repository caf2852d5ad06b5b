"""The W&B reader, the slow tests: timeouts, backoffs and Retry-After waited out in real time."""

from __future__ import annotations

import threading
import time

from server.runs.wandb_reader import WandbReader, WandbResult
from tests.support.standins.wandb_standin import WandbStandin
from tests.wandb.conftest import ENTITY, PATH, PROJECT, FakeClock, MakeReader
from tests.wandb.test_wandb_reader import OTHER_PATH, clean, warm


def settle(reader: WandbReader, standin: WandbStandin, timeout_s: float = 15.0) -> None:
    """Wait until the stand-in answered every request and the reader recorded the answers."""
    assert standin.wait_answered(timeout_s), "the stand-in still has requests in flight"
    assert reader.wait_idle(timeout_s), "the reader still has a fetch in flight"


def test_slow_wandb_never_blocks_the_caller(standin: WandbStandin, make_reader: MakeReader) -> None:
    reader = make_reader(wait_s=0.5, timeout_s=8.0, cache_s=30.0)
    warm(reader, standin)
    standin.add_run(ENTITY, PROJECT, "rlcs-other1", {"reward/mean": 0.25, "_step": 2}, [])
    standin.delay_s = 5.0

    started = time.monotonic()
    first = clean(reader.read("r-other1", OTHER_PATH))
    # Well under the 5 s W&B takes (the slack is for a busy machine, not for W&B).
    assert time.monotonic() - started < 3.0
    assert not first.ok and first.source == "none"
    assert first.note is not None and "did not answer within 0.5 s" in first.note

    # More readers while W&B is slow: each answered within wait_s, still one fetch in flight.
    answers: list[tuple[float, WandbResult]] = []

    def ask() -> None:
        t = time.monotonic()
        answer = reader.read("r-other1", OTHER_PATH)
        answers.append((time.monotonic() - t, answer))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(took < 3.0 and not answer.ok for took, answer in answers)
    assert standin.request_count == 1
    workers = [t for t in threading.enumerate() if t.name.startswith("wandb-read-")]
    assert len(workers) <= 1

    settle(reader, standin)
    assert time.monotonic() - started >= 5.0
    standin.delay_s = 0.0
    cached = clean(reader.read("r-other1", OTHER_PATH))
    assert cached.ok and cached.summary == {"reward/mean": 0.25, "_step": 2}
    assert cached.note is None
    assert standin.request_count == 1  # served from the cache the slow fetch filled


def test_fetch_gives_up_after_timeout_s_and_backs_off(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    reader = make_reader(timeout_s=1.0, wait_s=3.0)
    warm(reader, standin)
    standin.add_run(ENTITY, PROJECT, "rlcs-other1", {"_step": 0}, [])
    standin.delay_s = 4.0

    started = time.monotonic()
    result = clean(reader.read("r-other1", OTHER_PATH))
    assert time.monotonic() - started >= 0.9
    assert not result.ok
    assert result.note is not None
    # Given up after timeout_s, not after wait_s (3 s) nor W&B's 4 s.
    assert result.note.startswith("W&B timed out after 1 s — retrying after 5 s")
    # wandb cancelled the call inside wandb-core: nothing more reached W&B while the slow
    # request was still being answered.
    settle(reader, standin)
    assert standin.request_count == 1
    again = clean(reader.read("r-other1", OTHER_PATH))
    assert again.note is not None and "retrying after" in again.note
    assert standin.request_count == 1


def test_repeated_429_doubles_the_backoff(
    standin: WandbStandin, make_reader: MakeReader, clock: FakeClock
) -> None:
    reader = make_reader(cache_s=0.0, backoff_start_s=0.6)
    warm(reader, standin)
    standin.fail_next(2, 429)
    first = clean(reader.read("r-abc123", PATH))
    assert first.note is not None and "retrying after 1 s" in first.note  # 0.6 s, rounded up
    clock.advance(0.5)
    count = standin.request_count
    during = clean(reader.read("r-abc123", PATH))
    assert during.note is not None and "retrying after 1 s" in during.note
    assert standin.request_count == count  # still backing off: W&B is not asked
    clock.advance(0.2)
    standin.fail_next(2, 429)
    second = clean(reader.read("r-abc123", PATH))
    assert second.note is not None and "retrying after 2 s" in second.note  # 1.2 s
    clock.advance(1.3)
    recovered = clean(reader.read("r-abc123", PATH))
    assert recovered.ok and recovered.note is None and recovered.age_s == 0


def test_retry_after_is_waited_out_inside_wandb_core(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    # Measured fact: wandb-core honours Retry-After before its one retry, and does not pass the
    # header on; the reader then backs off on its own schedule.
    reader = make_reader(cache_s=0.0, timeout_s=5.0)
    warm(reader, standin)
    standin.fail_next(2, 429, retry_after_s=2)
    result = clean(reader.read("r-abc123", PATH))
    first, second = standin.requests
    assert (first.status, second.status) == (429, 429)
    assert second.at - first.at >= 1.9
    assert result.note is not None and "rate-limited (429) — retrying after 5 s" in result.note
