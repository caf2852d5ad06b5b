"""Learning curves of the algorithm knobs (docs/runs.md, "Algorithms"): SmolLM2-135M trained by
the real server (POST /runs, GET /runs/{id}/history), seeds not tuned, each set beside its
baseline in the same script:

- async: slow_repeat_word (every episode waits 50 ms, benchmarks/slow_env; 4 episodes in
  flight, as a service that takes 4 at a time) sampled ahead with max_steps_off_policy 1 and 2
  against the synchronous loop, at equal steps;
- speed: steps per minute of bound 1 against the synchronous loop on the same environment,
  short runs alternating (sync, bound 1, sync, ...) over several rounds so that the load of a
  shared machine falls on both alike; with 4 episodes in flight and with all in flight;
- kl: repeat_word with kl_penalty_coef 0.1 against 0, the KL to the base model measured in both;
- losses: gspo and stable_reinforce against importance_sampling (the kl set's KL 0 run);
- distill: a teacher trained on repeat_word, then a student distilled from its checkpoint with
  reward_coef 0 (the reward is only recorded), against the teacher's own reward.

Run from the repo root: .venv/bin/python -m benchmarks.algorithms [--steps 12] [--sets ...]
[--keep] [--plot-only]. Needs the `bench` extra (matplotlib) for the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks import learning
from benchmarks.learning import (
    OUT_DIR,
    TERMINAL,
    figure,
    machine,
    mean_of,
    save_figure,
    select,
    serving,
)
from core.settings import PROJECT_ROOT

# learning.py's settings, with repeat_word's 8 new tokens.
COMMON: dict[str, Any] = {**learning.COMMON, "max_token_length": 8}
SETS = ("async", "speed", "kl", "losses", "distill")
TEACHER_STEPS = 20
SPEED_STEPS = 6  # per run of the speed set; its first step (start-up) is not counted
SPEED_ROUNDS = 3
KEYS = (
    "reward/mean",
    "env/percent_correct",
    "time/step_s",
    "sampler/steps_off_policy",
    "kl/reference",
    "teacher/reverse_kl",
)


@dataclass
class Series:
    set: str
    name: str
    env: str
    body: dict[str, Any]
    run_id: str = ""
    status: str = ""
    error: str | None = None
    wall_s: float = 0.0
    steps: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)

    def series(self, key: str) -> list[float]:
        return [v for v in self.values.get(key, []) if v is not None]

    @property
    def steps_per_minute(self) -> float:
        """From the steps' own durations, the first (start-up, first batch) left out."""
        took = self.series("time/step_s")[1:]
        return 60 * len(took) / sum(took) if took else float("nan")


def plan(steps: int, sets: list[str]) -> list[Series]:
    """Every run but the distilled student (it needs its teacher's run id)."""
    out = []
    if "async" in sets:
        for bound in (0, 1, 2):
            body = {"max_steps_off_policy": bound, "loss_fn": "ppo", "max_num_workers": 4}
            name = f"bound {bound}" if bound else "sync"
            out.append(Series("async", name, "slow_repeat_word", body))
    if "speed" in sets:
        for workers, tag in ((4, "4 in flight"), (-1, "all in flight")):
            for round_ in range(1, SPEED_ROUNDS + 1):
                for bound in (0, 1):
                    name = f"{'bound 1' if bound else 'sync'}, {tag}, round {round_}"
                    body = {
                        "max_steps_off_policy": bound,
                        "loss_fn": "ppo",
                        "max_num_workers": workers,
                        "total_steps": SPEED_STEPS,
                    }
                    out.append(Series("speed", name, "slow_repeat_word", body))
    if "kl" in sets or "losses" in sets:
        # Named with no penalty, the reference is measured, not penalised: the baseline of
        # both the kl set and the losses set.
        out.append(Series("kl", "KL 0", "repeat_word", {"kl_reference": "base"}))
    if "kl" in sets:
        out.append(Series("kl", "KL 0.1", "repeat_word", {"kl_penalty_coef": 0.1}))
    if "losses" in sets:
        for loss in ("gspo", "stable_reinforce"):
            out.append(Series("losses", loss, "repeat_word", {"loss_fn": loss}))
    if "distill" in sets:
        out.append(Series("distill", "teacher", "repeat_word", {"total_steps": TEACHER_STEPS}))
    for series in out:
        series.body = {**COMMON, "total_steps": steps, **series.body}
    return out


def train(http: httpx.Client, series: Series, poll_s: float = 0.5) -> None:
    select(http, series.env)
    started = time.monotonic()
    created = http.post("/runs", json=series.body)
    if created.status_code != 200:
        raise SystemExit(f"POST /runs: HTTP {created.status_code}: {created.text}")
    series.run_id = created.json()["run_id"]
    while True:
        run = http.get(f"/runs/{series.run_id}").json()
        if run["status"] in TERMINAL:
            break
        time.sleep(poll_s)
    series.wall_s = time.monotonic() - started
    series.status, series.error = run["status"], run.get("error")
    rows = http.get(f"/runs/{series.run_id}/history", params={"keys": ",".join(KEYS)}).json()
    for row in rows["rows"]:
        if "reward/mean" not in row:
            continue
        series.steps.append(row["step"])
        for key in KEYS:
            series.values.setdefault(key, []).append(row.get(key))
    print(one_line(series), flush=True)


def measure(args: argparse.Namespace) -> list[Series]:
    done: list[Series] = []
    if args.keep and (args.out / "algorithms.json").exists():
        done = [s for s in load(args.out)[0] if s.set not in args.sets]
    env_dirs = str(PROJECT_ROOT / "benchmarks" / "slow_env")
    with serving(RLCS_ENV_DIRS=env_dirs) as http:
        for series in plan(args.steps, args.sets):
            train(http, series)
            done.append(series)
            save(done, args.out)
            if series.name == "teacher" and series.status == "succeeded":
                student = Series(
                    "distill",
                    "student",
                    "repeat_word",
                    {**COMMON, "total_steps": args.steps, "teacher": series.run_id},
                )
                student.body["reward_coef"] = 0
                train(http, student)
                done.append(student)
                save(done, args.out)
    return done


def one_line(s: Series) -> str:
    head, tail = slice(0, 3), slice(-3, None)
    reward = s.series("reward/mean")
    return (
        f"{s.set:8} {s.name:24} {s.status:9} reward {mean_of(reward, head):.3f} -> "
        f"{mean_of(reward, tail):.3f}  {s.steps_per_minute:.2f} steps/min  "
        f"wall {s.wall_s:.0f} s" + (f"  error: {s.error}" if s.error else "")
    )


def report(done: list[Series]) -> str:
    """Markdown tables, each set against its baseline (ratios in the last column)."""
    head, tail = slice(0, 3), slice(-3, None)
    out = []
    by_set = {name: [s for s in done if s.set == name] for name in SETS}
    if by_set["async"]:
        base = next(b for b in by_set["async"] if b.name == "sync")
        out.append(
            "| async (slow_repeat_word, ppo, 4 in flight) | reward, steps 1-3 | reward, last 3 | "
            "steps off policy (mean) | steps per minute | vs sync |"
        )
        out.append("|---|---:|---:|---:|---:|---:|")
        for s in by_set["async"]:
            off = s.series("sampler/steps_off_policy")
            out.append(
                f"| {s.name} | {mean_of(s.series('reward/mean'), head):.3f} | "
                f"{mean_of(s.series('reward/mean'), tail):.3f} | "
                f"{statistics.fmean(off) if off else 0:.2f} | {s.steps_per_minute:.2f} | "
                f"{s.steps_per_minute / base.steps_per_minute:.2f}x |"
            )
        out.append("")
    if by_set["speed"]:
        out.append(
            "| speed (slow_repeat_word) | round | sync, steps per minute | bound 1 | ratio |"
        )
        out.append("|---|---:|---:|---:|---:|")
        for tag in ("4 in flight", "all in flight"):
            ratios = []
            for round_ in range(1, SPEED_ROUNDS + 1):
                pair = {
                    s.name.split(",")[0]: s
                    for s in by_set["speed"]
                    if s.name.endswith(f"{tag}, round {round_}")
                }
                if len(pair) < 2:
                    continue
                sync, ahead = pair["sync"].steps_per_minute, pair["bound 1"].steps_per_minute
                ratios.append(ahead / sync)
                out.append(f"| {tag} | {round_} | {sync:.2f} | {ahead:.2f} | {ahead / sync:.2f}x |")
            if ratios:
                out.append(f"| {tag} | median | | | **{statistics.median(ratios):.2f}x** |")
        out.append("")
    rest = by_set["kl"] + by_set["losses"]
    if rest:
        base = next(s for s in rest if s.name == "KL 0")
        out.append(
            "| repeat_word | reward, steps 1-3 | reward, last 3 | correct, last 3 | "
            "KL to base, last 3 | KL to base, max | reward vs KL 0 / IS |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for s in rest:
            name = "importance_sampling, KL 0" if s.name == "KL 0" else s.name
            kl = s.series("kl/reference")
            tail_reward = mean_of(s.series("reward/mean"), tail)
            base_reward = mean_of(base.series("reward/mean"), tail)
            out.append(
                f"| {name} | {mean_of(s.series('reward/mean'), head):.3f} | {tail_reward:.3f} | "
                f"{mean_of(s.series('env/percent_correct'), tail):.0%} | "
                + (f"{mean_of(kl, tail):.4f} | {max(kl):.4f}" if kl else "- | -")
                + f" | {tail_reward / base_reward:.2f}x |"
            )
        out.append("")
    if by_set["distill"]:
        teacher = next((s for s in by_set["distill"] if s.name == "teacher"), None)
        student = next((s for s in by_set["distill"] if s.name == "student"), None)
        out.append(
            "| distill (repeat_word) | steps | reward, steps 1-3 | reward, last 3 | "
            "teacher reverse KL, first 3 | last 3 | reward vs teacher's |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        goal = mean_of(teacher.series("reward/mean"), tail) if teacher else float("nan")
        for s in (teacher, student):
            if s is None:
                continue
            rkl = s.series("teacher/reverse_kl")
            last = mean_of(s.series("reward/mean"), tail)
            out.append(
                f"| {s.name} | {len(s.steps)} | {mean_of(s.series('reward/mean'), head):.3f} | "
                f"{last:.3f} | "
                + (f"{mean_of(rkl, head):.3f} | {mean_of(rkl, tail):.3f}" if rkl else "- | -")
                + f" | {last / goal:.2f}x |"
            )
    return "\n".join(out)


def plot(done: list[Series], path: Path, title: str) -> None:
    panels = [
        ("async", "reward/mean", "async: mean reward (slow_repeat_word)"),
        ("kl", "kl/reference", "KL to the base model"),
        ("losses", "reward/mean", "losses: mean reward (repeat_word)"),
        ("distill", "reward/mean", "distillation: mean reward"),
    ]
    fig, axes = figure(1, len(panels), figsize=(5.2 * len(panels), 4.2))
    for axis, (name, key, label) in zip(axes, panels, strict=True):
        members = [s for s in done if s.set == name]
        if name == "losses":
            members = [s for s in done if s.name == "KL 0"] + members
        for s in members:
            xs = [x for x, v in zip(s.steps, s.values.get(key, []), strict=False) if v is not None]
            shown = "importance_sampling" if name == "losses" and s.name == "KL 0" else s.name
            axis.plot(xs, s.series(key), marker=".", label=shown)
        axis.set_title(label, fontsize=9)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(fig, title, path, 100)


def save(done: list[Series], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine(), "common": COMMON, "series": [asdict(s) for s in done]}
    (out / "algorithms.json").write_text(json.dumps(data, indent=1))


def load(out: Path) -> tuple[list[Series], str]:
    data = json.loads((out / "algorithms.json").read_text())
    return [Series(**s) for s in data["series"]], data["machine"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sets", type=lambda s: s.split(","), default=list(SETS))
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--plot-only", action="store_true", help="redraw from algorithms.json")
    parser.add_argument(
        "--keep", action="store_true", help="keep the other sets' runs from algorithms.json"
    )
    args = parser.parse_args()
    if set(args.sets) - set(SETS):
        raise SystemExit(f"unknown sets: {sorted(set(args.sets) - set(SETS))}")
    if args.plot_only:
        done, when = load(args.out)
    else:
        done, when = measure(args), machine()
    print(report(done))
    plot(done, args.out / "algorithms.png", f"SmolLM2-135M-Instruct, local backend ({when})")
    print(f"wrote {args.out / 'algorithms.png'} and {args.out / 'algorithms.json'}")


if __name__ == "__main__":
    main()
