"""The W&B stand-in's write side, driven by the real wandb 0.31 client online: what
`wandb.init` / `run.log` / `run.finish` send lands in the stand-in and reads back through
`wandb.Api`, including a rewind (`resume_from="<id>?_step=N"`).

The client runs in this process. wandb keeps process-wide settings from its first use (the
session fixture in conftest already made them), so each init names the stand-in's URL and key
in its own settings as well as in WANDB_BASE_URL / WANDB_API_KEY.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb

from tests.support.standins.wandb_standin import WandbStandin
from tests.wandb.conftest import ENTITY, KEY, PROJECT

RUN_ID = "rlcs-w1"
PATH = f"{ENTITY}/{PROJECT}/{RUN_ID}"
CONFIG = {"model_name": "SmolLM2-135M", "learning_rate": 4e-5, "group_size": 4}
KEYS = ["reward/mean", "train/loss"]


def first_row(step: int) -> dict[str, float]:
    return {"reward/mean": round(0.1 * step, 3), "train/loss": round(2.0 - 0.25 * step, 3)}


def second_row(step: int) -> dict[str, float]:
    """What the run logs after a rewind: different values at the same steps."""
    return {"reward/mean": round(0.9 + 0.01 * step, 3), "train/loss": round(0.05 * step, 3)}


def metrics(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in ["_step", *KEYS] if key in row}


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[WandbStandin]:
    with WandbStandin(expected_api_key=KEY) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        monkeypatch.setenv("WANDB_API_KEY", KEY)
        monkeypatch.setenv("WANDB_DIR", str(tmp_path))
        monkeypatch.delenv("WANDB_MODE", raising=False)  # tests/conftest.py sets offline
        yield server
        if wandb.run is not None:  # a test failed mid-run: end it while the stand-in is up
            wandb.run.finish(exit_code=1)


def start(standin: WandbStandin, tmp_path: Path, **kwargs: Any) -> Any:
    """`wandb.init` online against the stand-in, with what keeps it quick."""
    settings = wandb.Settings(
        base_url=standin.url,
        api_key=KEY,
        init_timeout=30,
        x_disable_stats=True,  # no system-metrics sampler
        console="off",  # no stdout capture
        x_file_stream_transmit_interval=0.05,
        **kwargs.pop("settings", {}),
    )
    return wandb.init(
        project=PROJECT,
        entity=ENTITY,
        dir=str(tmp_path),
        mode="online",
        settings=settings,
        **kwargs,
    )


def write_first_run(standin: WandbStandin, tmp_path: Path, **settings: Any) -> None:
    """Steps 1..6 of `first_row`, then finish (what a training run does, minus training)."""
    run = start(standin, tmp_path, id=RUN_ID, resume="allow", config=CONFIG, settings=settings)
    for step in range(1, 7):
        run.log(first_row(step), step=step)
    run.finish()


def read_back(standin: WandbStandin) -> Any:
    api = wandb.Api(overrides={"base_url": standin.url}, api_key=KEY, timeout=30)
    return api.run(PATH)


def finished(standin: WandbStandin) -> None:
    # finish() returns after the client's last file_stream post; this only makes it explicit.
    assert standin.wait_for_run(ENTITY, PROJECT, RUN_ID, lambda r: r.state == "finished")


# An online run ----------------------------------------------------------------------------


def test_online_run_is_written_and_reads_back(online: WandbStandin, tmp_path: Path) -> None:
    write_first_run(online, tmp_path)
    finished(online)

    # What the client sent, as the stand-in holds it.
    stored = online.run(ENTITY, PROJECT, RUN_ID)
    assert [metrics(row) for row in stored.history] == [
        {"_step": step, **first_row(step)} for step in range(1, 7)
    ]
    assert metrics(stored.summary) == {"_step": 6, **first_row(6)}
    assert {k: stored.config[k] for k in CONFIG} == CONFIG
    assert "_wandb" in stored.config  # the client's own block, which resuming relies on
    assert stored.state == "finished" and stored.exitcode == 0
    assert {"config.yaml", "wandb-summary.json", "wandb-metadata.json"} <= set(stored.files)
    assert (
        json.loads(stored.files["wandb-summary.json"])["reward/mean"] == first_row(6)["reward/mean"]
    )
    operations = online.operations()
    assert {"RunResumeStatus", "UpsertBucket", "CreateRunFiles"} <= set(operations)
    assert "RewindRun" not in operations
    assert all(r.status == 200 and r.authorized for r in online.requests)
    last = online.file_stream_posts[-1]
    assert last["complete"] is True and last["exitcode"] == 0

    # And what a reader sees through the real wandb.Api.
    run = read_back(online)
    assert run.state == "finished"
    assert run.summary["_step"] == 6
    assert {k: run.summary[k] for k in KEYS} == first_row(6)
    assert [metrics(row) for row in run.history(pandas=False, samples=100)] == [
        {"_step": step, **first_row(step)} for step in range(1, 7)
    ]
    assert run.config["learning_rate"] == CONFIG["learning_rate"]


def test_rewind_drops_later_steps_and_takes_new_ones(online: WandbStandin, tmp_path: Path) -> None:
    write_first_run(online, tmp_path)
    online.reset_log()

    # `id=` may go along with resume_from as long as it names the same run; `resume=` may not.
    run = start(online, tmp_path, id=RUN_ID, resume_from=f"{RUN_ID}?_step=3", config=CONFIG)
    assert run.id == RUN_ID
    for step in (4, 5):
        run.log(second_row(step), step=step)
    run.finish()
    finished(online)

    rewinds = [r for r in online.requests if r.operation == "RewindRun"]
    assert [r.variables for r in rewinds] == [
        {
            "runName": RUN_ID,
            "entity": ENTITY,
            "project": PROJECT,
            "metricName": "_step",
            "metricValue": 3,
        }
    ]
    assert "RunResumeStatus" not in online.operations()  # a rewind is not a resume
    assert all(r.status == 200 for r in online.requests)

    expected = [{"_step": s, **first_row(s)} for s in (1, 2, 3)] + [
        {"_step": s, **second_row(s)} for s in (4, 5)
    ]
    stored = online.run(ENTITY, PROJECT, RUN_ID)
    assert [metrics(row) for row in stored.history] == expected
    assert stored.rewinds == [3]
    assert {k: stored.config[k] for k in CONFIG} == CONFIG

    read = read_back(online)
    assert read.state == "finished"
    assert [metrics(row) for row in read.history(pandas=False, samples=100)] == expected
    assert {k: read.summary[k] for k in KEYS} == second_row(5)
    assert read.summary["_step"] == 5


def test_resume_allow_carries_on_after_the_last_step(online: WandbStandin, tmp_path: Path) -> None:
    # What the runner does on a resume today: the same id with resume="allow".
    write_first_run(online, tmp_path)
    run = start(online, tmp_path, id=RUN_ID, resume="allow", config=CONFIG)
    assert run.resumed
    run.log(second_row(7), step=7)
    run.finish()
    finished(online)

    stored = online.run(ENTITY, PROJECT, RUN_ID)
    assert [row["_step"] for row in stored.history] == [1, 2, 3, 4, 5, 6, 7]
    assert metrics(stored.summary) == {"_step": 7, **second_row(7)}


def test_non_zero_exit_reads_back_failed(online: WandbStandin, tmp_path: Path) -> None:
    run = start(online, tmp_path, id=RUN_ID, resume="allow", config=CONFIG)
    run.log(first_row(1), step=1)
    run.finish(exit_code=2)
    assert online.wait_for_run(ENTITY, PROJECT, RUN_ID, lambda r: r.exitcode is not None)
    assert online.run(ENTITY, PROJECT, RUN_ID).exitcode == 2
    assert read_back(online).state == "failed"


def test_gzip_file_stream_is_decoded(online: WandbStandin, tmp_path: Path) -> None:
    # wandb-core gzips file_stream posts when asked to and the server says FILESTREAM_GZIP.
    write_first_run(online, tmp_path, x_file_stream_no_gzip=False)
    finished(online)
    assert "ServerFeaturesQuery" in online.operations()
    assert online.file_stream_gzipped == len(online.file_stream_posts) > 0
    stored = online.run(ENTITY, PROJECT, RUN_ID)
    assert [row["_step"] for row in stored.history] == [1, 2, 3, 4, 5, 6]


# Without the client -----------------------------------------------------------------------


def test_file_stream_and_uploads_refuse_strangers(online: WandbStandin) -> None:
    online.add_run(ENTITY, PROJECT, RUN_ID)
    stream = f"{online.url}/files/{PATH}/file_stream"
    body = json.dumps({"files": {"wandb-history.jsonl": {"offset": 0, "content": ['{"a":1}']}}})
    for url, method, status in [
        (stream, "POST", 401),  # no API key
        (f"{online.url}/storage/not-a-token/config.yaml", "PUT", 403),  # no upload URL issued
    ]:
        request = urllib.request.Request(url, data=body.encode(), method=method)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        assert caught.value.code == status
    assert online.run(ENTITY, PROJECT, RUN_ID).history == []
