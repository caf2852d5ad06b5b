"""One run across several engine hosts (issue 55), with a real server, real hosts and signals
(RLCS_ENGINE_HOSTS=2 on the CPU, float32): a run sampling on two hosts draws what it draws on
one (tiny-random's rows round alike in any batch); a run training on two hosts as a group (its
datums split 4+4, the gradients summed) ends with the weights one host gives it; a host of a
group killed: the run resumes by itself, a run on the other host never notices; what the
machine cannot give is refused at POST /runs, naming the field.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.slow.test_engine_host import steps_recorded
from tests.support.helpers import TINY_RUN, finish_run, run_of, start_run, wait_for
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.timeout(600)
# 8 datums a step (2 tasks x 4 tries), float32, no eval: every step's weights compared.
RUN = {**TINY_RUN, "environment": "repeat_word", "steps_per_eval": 0, "total_steps": 5}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    var = tmp_path_factory.mktemp("across") / "var"
    # float32 sampling: a row's draw is the same whatever batch it shares (bfloat16 products
    # may round apart with the batch's size).
    float32 = {"RLCS_DTYPE": "float32", "RLCS_SAMPLING_DTYPE": "float32"}
    with LiveServer(var, RLCS_ENGINE_HOSTS="2", RLCS_MAX_CONCURRENT_RUNS="4", **float32) as server:
        yield server


def finished(server: LiveServer, **config: object) -> str:
    run_id = start_run(server.api, **{**RUN, **config})
    run = finish_run(server.api, run_id, timeout=300)
    assert run["status"] == "succeeded", (run, server.api.get(f"/runs/{run_id}/logs").text)
    return run_id


def episodes(server: LiveServer, run_id: str) -> list[tuple]:
    """Each step's episodes by group, as drawn (a step keeps them in the order they ended,
    which depends on which host answered first)."""
    page = server.api.get(f"/runs/{run_id}/rollouts", params={"limit": 200}).json()
    return sorted((e["step"], e["group"], e["completion"], e["reward"]) for e in page["items"])


def history(server: LiveServer, run_id: str) -> list[dict]:
    return [
        r for r in server.api.get(f"/runs/{run_id}/history").json()["rows"] if "time/step_s" in r
    ]


def final_adapter(server: LiveServer, run_id: str) -> dict:
    saved = server.api.get(f"/runs/{run_id}/checkpoints").json()
    last = max((c for c in saved if c["kind"] == "state"), key=lambda c: c["step"])
    return load_file(Path(last["path"]) / "adapter_model.safetensors")


def test_a_run_sampling_on_two_hosts_draws_what_it_draws_on_one(two_hosts: LiveServer) -> None:
    one = finished(two_hosts, seed=3)
    two = finished(two_hosts, seed=3, sample_hosts=2)
    assert episodes(two_hosts, two) == episodes(two_hosts, one)
    rows = history(two_hosts, two)
    assert [r["sampler/hosts"] for r in rows] == [2.0] * RUN["total_steps"]
    # Calls go to the host with the fewest in flight: the other host answers its share.
    assert all(0.0 < r["sampler/other_hosts_share"] < 1.0 for r in rows), rows
    assert "sampler/hosts" not in history(two_hosts, one)[0]


def test_a_run_sampling_ahead_on_two_hosts_stays_within_its_bound(two_hosts: LiveServer) -> None:
    """Each step's weights reach both hosts before that policy draws: a batch is at most
    `max_steps_off_policy` behind (its loss is importance_sampling: stable_reinforce reads
    what its trainer's host recorded)."""
    run_id = finished(two_hosts, max_steps_off_policy=1, sample_hosts=2)
    assert run_of(two_hosts.api, run_id)["config"]["loss_fn"] == "importance_sampling"
    rows = history(two_hosts, run_id)
    assert [r["sampler/steps_off_policy_max"] <= 1 for r in rows] == [True] * RUN["total_steps"]
    assert sum(r["sampler/stale_groups_dropped"] for r in rows) == 0
    assert all(r["sampler/hosts"] == 2.0 for r in rows)


def test_a_group_of_two_hosts_trains_as_one_host_does(two_hosts: LiveServer) -> None:
    one = finished(two_hosts, seed=5)
    group = finished(two_hosts, seed=5, num_devices=2)
    assert episodes(two_hosts, group) == episodes(two_hosts, one)  # the same data each step
    mine, alone = final_adapter(two_hosts, group), final_adapter(two_hosts, one)
    assert mine.keys() == alone.keys()
    assert max(float((mine[k] - alone[k]).abs().max()) for k in mine) <= 1e-6
    logs = two_hosts.api.get(f"/runs/{group}/logs").text
    assert "trains on 2 hosts as one group (gloo)" in logs


def test_a_killed_host_of_a_group_resumes_its_run_and_spares_the_other_host(
    two_hosts: LiveServer,
) -> None:
    server, steps = two_hosts, 150
    plain = start_run(server.api, **{**RUN, "total_steps": steps, "save_every": 2, "seed": 1})
    wait_for(lambda: run_of(server.api, plain)["step"] >= 1, 120, every=0.2)
    group = start_run(
        server.api, **{**RUN, "total_steps": steps, "save_every": 2, "num_devices": 2}
    )
    wait_for(lambda: run_of(server.api, group)["step"] >= 3, 240, every=0.2)
    hosts = server.api.get("/engine").json()["hosts"]
    plain_host = next(h for h in hosts if f"run {plain}" in {c["client"] for c in h["clients"]})
    other = next(h for h in hosts if h["name"] != plain_host["name"])
    assert f"run {group}" in {c["client"] for c in other["clients"]}

    os.kill(other["pid"], signal.SIGKILL)
    run = finish_run(server.api, group, timeout=400)
    assert run["status"] == "succeeded", run
    assert "resumed by itself" in (run["details"] or "")
    assert steps_recorded(server, group) == list(range(1, steps + 1))
    spared = finish_run(server.api, plain, timeout=300)
    assert spared["status"] == "succeeded" and "resumed" not in (spared["details"] or "")
    assert steps_recorded(server, plain) == list(range(1, steps + 1))


@pytest.mark.parametrize(
    ("asked", "field", "says"),
    [
        ({"num_devices": 3}, "num_devices", "this machine has 2"),
        ({"sample_hosts": 5}, "sample_hosts", "this machine has 2"),
        ({"num_devices": 2, "engine": "private"}, "num_devices", 'set engine "shared"'),
        ({"sample_hosts": 2, "loss_fn": "stable_reinforce"}, "sample_hosts", "sample_hosts 1"),
    ],
)
def test_hosts_the_machine_cannot_give_are_refused_naming_the_field(
    two_hosts: LiveServer, asked: dict, field: str, says: str
) -> None:
    before = len(two_hosts.api.get("/runs").json())
    refused = two_hosts.api.post("/runs", json={**RUN, **asked})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert f"'{field}'" in str(detail) and says in str(detail), detail
    assert len(two_hosts.api.get("/runs").json()) == before  # nothing made
