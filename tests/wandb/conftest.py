"""Fixtures: a W&B stand-in holding one training run, and readers pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from server.runs.wandb_reader import WandbReader
from tests.support.standins.wandb_standin import WandbStandin

KEY = "standin0" + "0123456789abcdef" * 2  # 40 characters, like a real W&B key
ENTITY = "team-rl"
PROJECT = "rl-training"
RUN_ID = "rlcs-abc123"
PATH = f"{ENTITY}/{PROJECT}/{RUN_ID}"

SUMMARY = {
    "reward/mean": 0.625,
    "train/loss": 0.183,
    "env/percent_correct": 0.55,
    "eval/percent_correct": 0.5,
    "_step": 9,
    "_runtime": 42.0,
}
HISTORY = [
    {
        "_step": step,
        "reward/mean": round(0.1 * step, 3),
        "train/loss": round(1.0 - 0.09 * step, 3),
        "env/percent_correct": round(0.05 * step, 3),
        **({"eval/percent_correct": round(0.1 * step, 3)} if step % 5 == 4 else {}),
    }
    for step in range(10)
]

MakeReader = Callable[..., WandbReader]


class FakeClock:
    """The readers' clock in these tests: cache windows and backoffs pass when a test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session", autouse=True)
def _wandb_core_running() -> None:
    # A reader's first use imports wandb and starts the wandb-core process (1-6 s on a busy
    # machine); do both once, up front, so the timings these tests assert measure W&B answers.
    import wandb

    with WandbStandin(expected_api_key=KEY) as server:
        wandb.Api(overrides={"base_url": server.url}, api_key=KEY, timeout=60)


@pytest.fixture
def standin() -> Iterator[WandbStandin]:
    with WandbStandin(expected_api_key=KEY) as server:
        server.add_run(
            ENTITY, PROJECT, RUN_ID, SUMMARY, HISTORY, display_name="SmolLM2-135M-r-abc123"
        )
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_reader(standin: WandbStandin, clock: FakeClock) -> Iterator[MakeReader]:
    readers: list[WandbReader] = []

    def make(**overrides: Any) -> WandbReader:
        values: dict[str, Any] = {
            "api_key": KEY,
            "base_url": standin.url,
            "cache_s": 30.0,
            "timeout_s": 3.0,
            "wait_s": 10.0,  # the first read also starts wandb-core and logs in
            "clock": clock,
        }
        values.update(overrides)
        reader = WandbReader(**values)
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.close()
