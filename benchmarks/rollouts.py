"""Episode collection: our loop (`runners.episodes.rollouts.collect`, a new episode the moment
one ends) against wave-by-wave collection as in the reference GEM script, with a fixed-latency
sampler. Run from the repo root:
.venv/bin/python -m benchmarks.rollouts [--latency-ms 50] [--repeats 5]"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from environments.base import BaseEnv, Split, StepResult
from runners.episodes.rollouts import Collected, Episode, EpisodeSpec, collect, run_episode

MIN_TURNS, MAX_TURNS = 1, 8


class UnevenEnv(BaseEnv):
    """Episodes of 1 to 8 turns, the length drawn from the seed; reward 1 on the last turn."""

    name = "uneven"

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0
        self.length = 0

    async def reset(self, seed: int, split: Split = "train") -> str:
        self.turns = 0
        self.length = random.Random(seed).randint(MIN_TURNS, MAX_TURNS)
        return "start"

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        done = self.turns >= self.length
        return StepResult(observation="go on", reward=1.0 if done else 0.0, done=done)


class FixedLatencySampler:
    """Stands in for a sampling client whose every call takes the same time (no CPU work),
    so any time beyond the ideal bound comes from the scheduling of episodes."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.calls = 0  # finished calls: one cancelled mid-way cost less than `latency_s`

    async def sample(self, prompt_tokens: list[int]) -> tuple[list[int], list[float]]:
        await asyncio.sleep(self.latency_s)
        self.calls += 1
        return [7, 8, 9, 10], [-0.5, -0.5, -0.5, -0.5]


def render(observation: str) -> list[int]:
    return [1, 2, 3]


def decode(tokens: list[int]) -> str:
    return "x"


# A rule for when the batch is full, used by both methods.
Enough = Callable[[Collected], bool]


@dataclass
class Timing:
    seconds: float
    calls: int  # finished sample calls, including those of episodes abandoned at the end
    episodes: int
    transitions: int

    def ideal_s(self, latency_s: float, concurrency: int) -> float:
        return self.calls * latency_s / concurrency


async def ours(
    specs: Iterator[EpisodeSpec], sampler: FixedLatencySampler, concurrency: int, enough: Enough
) -> Collected:
    return await collect(specs, sampler, render, decode, concurrency=concurrency, enough=enough)


async def waves(
    specs: Iterator[EpisodeSpec], sampler: FixedLatencySampler, concurrency: int, enough: Enough
) -> Collected:
    """The reference script's `collect_episodes_buffer_async`: `concurrency` episodes started
    together with asyncio.gather, the next wave only once the whole wave is done."""
    out = Collected(episodes=[])
    while not enough(out):
        wave = [spec for _, spec in zip(range(concurrency), specs, strict=False)]
        if not wave:
            break
        episodes: list[Episode] = await asyncio.gather(
            *(run_episode(spec, sampler, render, decode) for spec in wave)
        )
        out.episodes.extend(episodes)
    return out


async def timed(
    method: Callable[..., object],
    seeds: list[int],
    latency_s: float,
    concurrency: int,
    enough: Enough,
) -> Timing:
    sampler = FixedLatencySampler(latency_s)
    specs = iter([EpisodeSpec(group=i, seed=s, make_env=UnevenEnv) for i, s in enumerate(seeds)])
    start = time.perf_counter()
    got = await method(specs, sampler, concurrency, enough)  # type: ignore[misc]
    seconds = time.perf_counter() - start
    assert isinstance(got, Collected) and got.failed == 0, got
    return Timing(seconds, sampler.calls, len(got.episodes), got.transitions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency-ms", type=float, default=50.0, help="per sample call")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    parser.add_argument("--episodes", type=int, default=64, help="batch: this many episodes")
    parser.add_argument(
        "--transitions",
        type=int,
        default=0,
        help="batch: episodes until at least this many transitions (the reference's and "
        "our rebn rule) instead of --episodes",
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    latency_s, concurrency = args.latency_ms / 1e3, args.concurrency
    if args.transitions:
        rule = f">= {args.transitions} transitions"
        count = args.transitions * 4  # more seeds than either method can use

        def enough(got: Collected) -> bool:
            return got.transitions >= args.transitions
    else:
        rule = f"{args.episodes} episodes"
        count = args.episodes

        def enough(got: Collected) -> bool:
            return len(got.episodes) >= args.episodes

    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"sampler: {args.latency_ms:g} ms per call (asyncio.sleep); episodes of "
        f"{MIN_TURNS}..{MAX_TURNS} turns (uniform, from the seed); concurrency {concurrency}; "
        f"batch: {rule}; {args.repeats} repeats, each with its own seeds, the same for both"
    )
    methods: list[tuple[str, Callable[..., object]]] = [
        ("ours: collect (refill at once)", ours),
        ("baseline: waves (asyncio.gather)", waves),
    ]
    results: dict[str, list[Timing]] = {name: [] for name, _ in methods}
    for repeat in range(args.repeats):
        rng = random.Random(repeat)
        seeds = [rng.randrange(2**31) for _ in range(count)]
        # Alternate which goes first, so neither always runs on a colder interpreter.
        order = methods if repeat % 2 == 0 else methods[::-1]
        for name, method in order:
            results[name].append(asyncio.run(timed(method, seeds, latency_s, concurrency, enough)))

    print(
        f"\n  {'method':<34} {'median s':>8} {'min s':>6} {'max s':>6} {'calls':>6} "
        f"{'unused':>6} {'episodes':>8} {'trans.':>6} {'turns/ep':>8} {'ideal s':>7} "
        f"{'efficiency':>10}"
    )
    medians = {}
    for name, timings in results.items():
        median = statistics.median(t.seconds for t in timings)
        medians[name] = median
        calls = statistics.median(t.calls for t in timings)
        # Calls whose turn is not in the batch: episodes abandoned when the batch was full.
        unused = statistics.median(t.calls - t.transitions for t in timings)
        episodes = statistics.median(t.episodes for t in timings)
        transitions = statistics.median(t.transitions for t in timings)
        ideal = statistics.median(t.ideal_s(latency_s, concurrency) for t in timings)
        # Per repeat, so each efficiency compares a time with its own number of calls.
        efficiency = statistics.median(
            t.ideal_s(latency_s, concurrency) / t.seconds for t in timings
        )
        turns = sum(t.transitions for t in timings) / sum(t.episodes for t in timings)
        print(
            f"  {name:<34} {median:>8.3f} {min(t.seconds for t in timings):>6.3f} "
            f"{max(t.seconds for t in timings):>6.3f} {calls:>6.0f} {unused:>6.0f} "
            f"{episodes:>8.0f} {transitions:>6.0f} {turns:>8.2f} {ideal:>7.3f} {efficiency:>9.0%}"
        )
    ours_s, waves_s = (medians[name] for name, _ in methods)
    per_repeat = statistics.median(
        w.seconds / o.seconds for o, w in zip(*results.values(), strict=True)
    )
    print(
        f"\n  waves / ours: {waves_s / ours_s:.2f}x by medians ({per_repeat:.2f}x median of the "
        f"per-repeat ratios)\n  ideal bound = finished sample calls x {args.latency_ms:g} ms / "
        f"{concurrency}; efficiency = ideal / measured (median over repeats)"
    )
    print(
        f"  turns/ep: mean length of the episodes kept; the seeds' lengths average "
        f"{(MIN_TURNS + MAX_TURNS) / 2:.2f} turns"
    )


if __name__ == "__main__":
    main()
