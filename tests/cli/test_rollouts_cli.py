"""`rlctl runs rollouts` against a live server holding a run's recorded episodes: the table, a
step's group, --full with the environment's and the model's text apart, --steps, --json, the
cursor, and a bad query's 422 naming the field."""

from __future__ import annotations

import json

import pytest

from core.db import make_engine
from tests.cli.conftest import Rlctl
from tests.support.live_server import LiveServer
from tests.support.rollouts import episode, seed_run

RUN = "r-00c11c11"


@pytest.fixture(scope="module")
def seeded(server: LiveServer) -> str:
    engine = make_engine(f"sqlite:///{server.var_dir / 'rlcs.db'}")
    steps = {1: [episode(i, float(i % 2), group=i // 2) for i in range(4)]}
    steps[2] = [episode(0, 1.0, prompt="Say <b>\x1b[31mhi</b>")]
    seed_run(engine, RUN, steps)
    engine.dispose()
    return RUN


def test_a_table_of_a_steps_episodes_and_a_group(rlctl_in: Rlctl, seeded: str) -> None:
    done = rlctl_in("runs", "rollouts", seeded, "--step", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "STEP", "GROUP", "#", "REWARD", "ADVANTAGE", "FINISH", "TOKENS", "COMPLETION"
    ]  # fmt: skip
    assert [line.split()[:4] for line in lines[1:]] == [
        ["1", "0", "0", "0"],
        ["1", "0", "1", "1"],
        ["1", "1", "2", "0"],
        ["1", "1", "3", "1"],
    ]
    group = rlctl_in("runs", "rollouts", seeded, "--step", "1", "--group", "1", "--min-reward", "1")
    assert [line.split()[:3] for line in group.stdout.splitlines()[1:]] == [["1", "1", "3"]]


def test_full_episodes_the_steps_record_json_and_the_cursor(rlctl_in: Rlctl, seeded: str) -> None:
    full = rlctl_in("runs", "rollouts", seeded, "--step", "2", "--full")
    assert full.returncode == 0, full.stderr
    assert "[env] Say <b>\\x1b[31mhi</b>" in full.stdout  # a terminal escape stays text
    assert "[model] answer 0" in full.stdout
    steps = rlctl_in("runs", "rollouts", seeded, "--steps")
    assert steps.stdout.splitlines()[1].split()[:4] == ["STEP", "SAMPLED", "RECORDED", "KEPT"]
    assert steps.stdout.splitlines()[2].split()[:5] == ["1", "4", "4", "4", "0.5"]
    first = rlctl_in("runs", "rollouts", seeded, "--limit", "3")
    assert (
        first.stdout.splitlines()[-1]
        == "more: --cursor "
        + json.loads(rlctl_in("runs", "rollouts", seeded, "--limit", "3", "--json").stdout)[
            "next_cursor"
        ]
    )
    cursor = first.stdout.splitlines()[-1].split()[-1]
    rest = json.loads(rlctl_in("runs", "rollouts", seeded, "--cursor", cursor, "--json").stdout)
    assert [(i["step"], i["index"]) for i in rest["items"]] == [(1, 3), (2, 0)]


def test_a_bad_step_is_refused_naming_it(rlctl: Rlctl, seeded: str) -> None:
    done = rlctl("runs", "rollouts", seeded, "--step", "-1")
    assert done.returncode != 0
    assert "step:" in done.stderr and "greater than or equal to 0" in done.stderr
