"""The W&B reader against the loopback stand-in, driven through the real wandb 0.31 client."""

from __future__ import annotations

import subprocess
import sys

from server.runs.wandb_reader import WandbReader, WandbResult
from tests.support.standins.wandb_standin import WandbStandin
from tests.wandb.conftest import (
    ENTITY,
    HISTORY,
    KEY,
    PATH,
    PROJECT,
    RUN_ID,
    SUMMARY,
    FakeClock,
    MakeReader,
)

OTHER_PATH = f"{ENTITY}/{PROJECT}/rlcs-other1"


def clean(result: WandbResult) -> WandbResult:
    """Every answer in these tests goes through here: the key must never show."""
    assert KEY not in repr(result)
    return result


def warm(reader: WandbReader, standin: WandbStandin) -> None:
    """A first read: starts wandb-core and logs in, so later fetches are one call each."""
    assert clean(reader.read("r-abc123", PATH)).ok
    standin.reset_log()


# Reading ---------------------------------------------------------------------------------


def test_reads_summary_metrics_by_recorded_path(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    reader = make_reader()
    result = clean(reader.read("r-abc123", PATH))
    assert result.ok and result.source == "wandb" and result.note is None
    assert result.age_s is not None and result.age_s < 1
    assert result.summary is not None
    for key in ("reward/mean", "train/loss", "env/percent_correct", "eval/percent_correct"):
        assert result.summary[key] == SUMMARY[key]
    assert result.summary["_step"] == 9
    assert result.state == "running"
    assert result.url is not None and result.url.endswith(f"/{ENTITY}/{PROJECT}/runs/{RUN_ID}")
    # Login once, then one Run query; the run is asked for by its id, not its display name.
    assert standin.operations() == ["Viewer", "Run"]
    run_query = standin.requests[-1]
    assert run_query.variables == {"entity": ENTITY, "project": PROJECT, "name": RUN_ID}
    assert all(r.authorized for r in standin.requests)
    assert KEY not in repr(reader)


def test_second_read_within_cache_window_makes_no_request(
    standin: WandbStandin, make_reader: MakeReader, clock: FakeClock
) -> None:
    reader = make_reader(cache_s=30.0)
    first = clean(reader.read("r-abc123", PATH))
    count = standin.request_count
    clock.advance(29.0)
    second = clean(reader.read("r-abc123", PATH))
    assert standin.request_count == count
    assert second.ok and second.summary == first.summary
    assert second.age_s == 29.0


def test_read_after_cache_window_sees_new_values(
    standin: WandbStandin, make_reader: MakeReader, clock: FakeClock
) -> None:
    reader = make_reader(cache_s=30.0)
    warm(reader, standin)
    standin.log(ENTITY, PROJECT, RUN_ID, {"_step": 10, "reward/mean": 0.75})
    standin.update_run(ENTITY, PROJECT, RUN_ID, state="finished")
    clock.advance(30.5)
    result = clean(reader.read("r-abc123", PATH))
    assert result.ok and result.summary is not None
    assert result.summary["reward/mean"] == 0.75 and result.summary["_step"] == 10
    assert result.state == "finished"
    assert standin.operations() == ["Run"]


def test_history_returns_the_requested_keys(standin: WandbStandin, make_reader: MakeReader) -> None:
    reader = make_reader()
    warm(reader, standin)
    result = clean(reader.history("r-abc123", PATH, ["reward/mean", "env/percent_correct"]))
    assert result.ok and result.history is not None
    assert [row["_step"] for row in result.history] == list(range(10))
    for row, logged in zip(result.history, HISTORY, strict=True):
        assert set(row) == {"_step", "reward/mean", "env/percent_correct"}
        assert row["reward/mean"] == logged["reward/mean"]
    # Rows holding every key asked for: eval is logged every fifth step only.
    evals = clean(reader.history("r-abc123", PATH, ["eval/percent_correct"]))
    assert evals.history == [
        {"_step": 4, "eval/percent_correct": 0.4},
        {"_step": 9, "eval/percent_correct": 0.9},
    ]
    sampled = clean(reader.history("r-abc123", PATH, ["train/loss"], samples=3))
    assert sampled.history is not None and len(sampled.history) == 3
    assert standin.operations() == ["RunSampledHistory"] * 3
    # The same series again within the cache window: no request.
    clean(reader.history("r-abc123", PATH, ["reward/mean", "env/percent_correct"]))
    assert standin.request_count == 3


def test_warm_up_logs_in_ahead_of_the_first_read(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    reader = make_reader(wait_s=5.0)
    thread = reader.warm_up()
    assert thread is not None
    thread.join(30)
    assert standin.operations() == ["Viewer"]  # logged in before anyone asked
    result = clean(reader.read("r-abc123", PATH))
    assert result.ok and result.note is None
    assert standin.operations() == ["Viewer", "Run"]


# Slow W&B ----------------------------------------------------------------------------------


# Rate limits and server errors -------------------------------------------------------------


def test_429_backs_off_every_run_and_serves_the_cache(
    standin: WandbStandin, make_reader: MakeReader, clock: FakeClock
) -> None:
    reader = make_reader(cache_s=0.2)
    warm(reader, standin)
    standin.fail_next(2, 429)  # wandb-core retries once by itself, so fail both attempts
    clock.advance(0.25)

    result = clean(reader.read("r-abc123", PATH))
    assert [(r.operation, r.status) for r in standin.requests] == [("Run", 429), ("Run", 429)]
    # The cached values, with their age and why they are not fresh.
    assert result.ok and result.summary is not None and result.summary["_step"] == 9
    assert result.age_s is not None and result.age_s > 0.2
    assert result.note is not None
    assert result.note.startswith("W&B rate-limited (429) — retrying after 5 s")
    assert "showing W&B values from" in result.note

    count = standin.request_count
    for run_key, path in (("r-abc123", PATH), ("r-other1", OTHER_PATH)):
        during = clean(reader.read(run_key, path))
        assert during.note is not None and "rate-limited (429) — retrying after" in during.note
    assert not clean(reader.read("r-other1", OTHER_PATH)).ok  # nothing cached for that one
    assert standin.request_count == count


def test_503_backs_off_that_run_only(standin: WandbStandin, make_reader: MakeReader) -> None:
    reader = make_reader(cache_s=0.0)
    warm(reader, standin)
    standin.fail_next(2, 503)
    result = clean(reader.read("r-abc123", PATH))
    assert result.ok  # the cached values
    assert result.note is not None and result.note.startswith("W&B error 503 — retrying after 5 s")
    count = standin.request_count
    during = clean(reader.read("r-abc123", PATH))
    assert during.note is not None and "W&B error 503 — retrying after" in during.note
    assert standin.request_count == count
    standin.add_run(ENTITY, PROJECT, "rlcs-other1", {"_step": 1}, [])
    other = clean(reader.read("r-other1", OTHER_PATH))
    assert other.ok and other.note is None and standin.request_count == count + 1


# Refusals ------------------------------------------------------------------------------------


def test_run_not_found(standin: WandbStandin, make_reader: MakeReader) -> None:
    reader = make_reader()
    warm(reader, standin)
    result = clean(reader.read("r-gone", f"{ENTITY}/{PROJECT}/rlcs-gone00"))
    assert not result.ok and result.source == "none"
    assert result.note == f"W&B has no run {ENTITY}/{PROJECT}/rlcs-gone00 (run not found)"
    count = standin.request_count
    clean(reader.read("r-gone", f"{ENTITY}/{PROJECT}/rlcs-gone00"))
    assert standin.request_count == count  # not asked again within the cache window


def test_no_api_key_makes_no_request(standin: WandbStandin, make_reader: MakeReader) -> None:
    reader = make_reader(api_key=None)
    result = clean(reader.read("r-abc123", PATH))
    assert not result.ok and result.source == "none"
    assert result.note is not None and "no WANDB_API_KEY" in result.note
    assert not clean(reader.history("r-abc123", PATH, ["reward/mean"])).ok
    assert standin.request_count == 0


def test_path_that_is_not_entity_project_id_makes_no_request(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    reader = make_reader()
    for path in ("SmolLM2-135M-r-abc123", f"{PROJECT}/{RUN_ID}", f"{ENTITY}//{RUN_ID}"):
        result = clean(reader.read("r-abc123", path))
        assert not result.ok and result.note is not None and "entity/project/run_id" in result.note
    assert standin.request_count == 0


def test_rejected_key_is_named_but_never_shown(
    standin: WandbStandin, make_reader: MakeReader
) -> None:
    wrong = "wrongkey" + "fedcba9876543210" * 2
    reader = make_reader(api_key=wrong)
    result = reader.read("r-abc123", PATH)
    assert not result.ok
    assert result.note is not None and result.note.startswith("W&B rejected the API key (HTTP 401)")
    assert wrong not in repr(result) and wrong not in repr(reader)


def test_server_module_does_not_import_wandb() -> None:
    code = (
        "import sys, server.runs.wandb_reader as m; "
        "m.WandbReader(None, None, 5, 3).read('r', 'a/b/c'); "
        "sys.exit('wandb' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
