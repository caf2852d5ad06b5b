"""The rollout record below the API, on a real SQLite file and a real PostgreSQL: what a step
keeps (all up to the setting, then the best, the worst and a seeded sample), a step written and
paged back, a step done again replacing its record, the run's size cap thinning older steps
first, and a write that fails stopping the record, never the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from core import lifecycle, rollout_store, schema
from core.db import make_engine, read_session, write_session
from core.models import Rollout, Run
from core.rollout_recorder import RolloutRecorder
from core.rollout_store import Filters
from core.rollouts import RolloutRecord, Segment, body_json, pick

RUN = "r-0000abcd"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    schema.upgrade(engine)
    with write_session(engine) as session:
        session.add(Run(id=RUN, environment="e", config_json="{}", config_hash="h", run_dir="/x"))
    yield engine
    engine.dispose()


def record(index: int, reward: float | None, *, group: int = 0, text: str = "") -> RolloutRecord:
    prompt = f"prompt {group}"
    completion = text or f"answer {index}"
    return RolloutRecord(
        kind="episode",
        group=group,
        index=index,
        prompt=prompt,
        completion=completion,
        reward=reward,
        advantage=None if reward is None else reward - 0.5,
        segments=[Segment("env", prompt, 2), Segment("model", completion, 2, reward=reward)],
    )


def test_a_step_keeps_all_up_to_the_limit_then_the_best_the_worst_and_a_seeded_sample() -> None:
    few = [record(i, i / 10) for i in range(8)]
    assert [how for _, how in pick(few, 8, seed=1)] == ["all"] * 8
    assert pick(few, 0, seed=1) == []

    many = [record(i, float(i)) for i in range(100)]
    kept = pick(many, 20, seed=7)
    assert len(kept) == 20
    by_how: dict[str, list[float]] = {}
    for r, how in kept:
        by_how.setdefault(how, []).append(r.reward or 0.0)
    assert sorted(by_how["best"]) == [95.0, 96.0, 97.0, 98.0, 99.0]
    assert sorted(by_how["worst"]) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(by_how["random"]) == 10 and all(5 <= r <= 94 for r in by_how["random"])
    assert [r.index for r, _ in kept] == sorted(r.index for r, _ in kept)  # the step's order
    assert [r.index for r, _ in pick(many, 20, seed=7)] == [r.index for r, _ in kept]
    assert [r.index for r, _ in pick(many, 20, seed=8)] != [r.index for r, _ in kept]
    small = pick(many, 3, seed=7)  # a small setting keeps an end of each side too
    assert sorted(how for _, how in small) == ["best", "random", "worst"]
    # No reward known (a Tinker session's samples): a random sample only.
    unscored = [record(i, None) for i in range(10)]
    assert {how for _, how in pick(unscored, 4, seed=1)} == {"random"}


def test_a_step_is_written_paged_filtered_and_replaced_when_done_again(engine: Engine) -> None:
    step1 = [record(i, float(i % 3), group=i // 4) for i in range(8)]
    step2 = [record(i, 1.0, group=0) for i in range(3)]
    for step, records in ((1, step1), (2, step2)):
        rollout_store.write_step(
            engine, RUN, step, pick(records, 256, 0), sampled=records, max_bytes=10**9
        )
    with read_session(engine) as session:
        everything = rollout_store.page(session, RUN, Filters(), 100)
        assert [(r.step, r.position) for r in everything] == [(1, i) for i in range(8)] + [
            (2, i) for i in range(3)
        ]
        first = rollout_store.page(session, RUN, Filters(), 5)
        rest = rollout_store.page(session, RUN, Filters(), 100, (first[-1].step, first[-1].id))
        assert [r.id for r in first + rest] == [r.id for r in everything]
        group1 = rollout_store.page(session, RUN, Filters(step=1, group=1), 100)
        assert [r.position for r in group1] == [4, 5, 6, 7]
        high = rollout_store.page(session, RUN, Filters(min_reward=1.5), 100)
        assert {r.reward for r in high} == {2.0}
        summary = {s.step: s for s in rollout_store.steps(session, RUN)}
    assert summary[1].sampled == summary[1].recorded == summary[1].kept == 8
    assert summary[1].reward_mean == pytest.approx(sum(r.reward or 0 for r in step1) / 8)
    assert (summary[1].reward_min, summary[1].reward_max) == (0.0, 2.0)

    # Step 2 done again (a resume went back before it): its record is replaced, not doubled.
    again = [record(i, 0.0) for i in range(2)]
    rollout_store.write_step(engine, RUN, 2, pick(again, 256, 0), sampled=again, max_bytes=10**9)
    with read_session(engine) as session:
        assert len(rollout_store.page(session, RUN, Filters(step=2), 100)) == 2
    # A rewind to step 1 drops the record of the steps after it.
    lifecycle.rewind(engine, RUN, 1)
    with read_session(engine) as session:
        assert {s.step for s in rollout_store.steps(session, RUN)} == {1}


def test_the_size_cap_thins_older_steps_first_keeping_their_best_and_worst(engine: Engine) -> None:
    def step_records(step: int) -> list[RolloutRecord]:
        return [record(i, float(i), text=f"s{step} " + "x" * 900) for i in range(10)]

    one = len(body_json(step_records(1)[0]).encode())
    cap = one * 25  # two and a half steps
    for step in range(1, 6):
        records = step_records(step)
        written = rollout_store.write_step(
            engine, RUN, step, pick(records, 256, 0), sampled=records, max_bytes=cap
        )
    assert written.kept == 10
    with read_session(engine) as session:
        summary = {s.step: s for s in rollout_store.steps(session, RUN)}
        stored = sum(r.size for r in rollout_store.page(session, RUN, Filters(), 1000))
        kept_rewards = {
            step: sorted(
                r.reward or 0.0 for r in rollout_store.page(session, RUN, Filters(step=step), 100)
            )
            for step in summary
        }
    assert stored <= cap
    assert stored == sum(s.size for s in summary.values())
    assert summary[5].kept == 10 and summary[5].note is None  # the newest is whole
    for step in (1, 2, 3):  # older ones thinned first, to their best and worst
        assert kept_rewards[step] in ([0.0, 9.0], []), kept_rewards
        assert summary[step].sampled == summary[step].recorded == 10
        assert "rollouts_max_mb" in (summary[step].note or "")
    assert kept_rewards[1] == [0.0, 9.0]  # the oldest kept its ends: they fit


def test_a_failed_write_stops_the_record_saying_so_never_the_caller(engine: Engine) -> None:
    said: list[str] = []
    recorder = RolloutRecorder(engine, RUN, per_step=4, max_bytes=10**9, seed=0, say=said.append)
    records = [record(i, float(i)) for i in range(6)]
    assert len(recorder.record(1, records)) == 4
    recorder.close()
    assert recorder.metrics() == {}
    # What a full disk does to an insert, made real by the database itself.
    if engine.dialect.name == "sqlite":
        trigger = (
            "CREATE TRIGGER disk_full BEFORE INSERT ON rollout "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )
        ddl = [trigger]
    else:
        ddl = [
            "CREATE FUNCTION disk_full() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'could not extend file: No space left on device'; END $$ "
            "LANGUAGE plpgsql",
            "CREATE TRIGGER disk_full BEFORE INSERT ON rollout FOR EACH ROW "
            "EXECUTE FUNCTION disk_full()",
        ]
    with engine.begin() as conn:
        for statement in ddl:
            conn.exec_driver_sql(statement)
    recorder.record(2, records)
    recorder.close()
    assert recorder.metrics()["rollouts/stopped"] == 1.0
    assert said and "not recorded from step 2" in said[0]
    assert "disk is full" in said[0] or "No space left" in said[0]
    assert recorder.record(3, records) == []  # stopped: nothing more is queued
    with read_session(engine) as session:
        summary = {s.step: s for s in rollout_store.steps(session, RUN)}
        assert session.get(Rollout, 1) is not None  # step 1's record stays
    assert summary[1].kept == 4
    assert "not recorded from step 2" in (summary[2].note or "")


def test_waiting_for_a_step_returns_once_its_table_is_handed_on(engine: Engine) -> None:
    handed = threading.Event()
    release = threading.Event()

    def on_written(step: int, kept: object) -> None:
        handed.set()
        release.wait(10)

    recorder = RolloutRecorder(
        engine, RUN, per_step=2, max_bytes=10**9, seed=0, say=print, on_written=on_written
    )
    assert recorder.wait_for(1, 0.0)  # nothing queued: nothing to wait for
    recorder.record(1, [record(i, float(i)) for i in range(3)])
    assert handed.wait(10)
    assert not recorder.wait_for(1, 0.05)  # the table of step 1 is still being handed on
    release.set()
    assert recorder.wait_for(1, 10)
    assert recorder.wait_for(5, 0.0)  # steps never queued are not waited for
    recorder.close()
