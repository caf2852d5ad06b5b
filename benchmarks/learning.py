"""Learning curves: SmolLM2-135M trained by the real server on repeat_word and arithmetic with
every loss and both advantage modes on the same seeds; a PNG of mean reward and percent correct
against step, a table, and POST /runs -> first step. Needs the `bench` extra (matplotlib).
`--e2e` instead times one real run's steps (repeat_word, 64 episodes x 64 tokens).
Run from the repo root: .venv/bin/python -m benchmarks.learning [--steps 20] [--plot-only]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.inference import Server
from core.settings import PROJECT_ROOT

LOSSES = ("importance_sampling", "ppo", "cispo", "dro")
ADVANTAGES = ("grpo", "rebn")
OUT_DIR = PROJECT_ROOT / "benchmarks" / "results"
TERMINAL = {"succeeded", "failed", "stopped", "lost"}

# Episodes per step are the same in both advantage modes: grpo draws batch_size x group_size
# episodes, rebn counts transitions (one per episode here): its batch_size is their product.
COMMON: dict[str, Any] = {
    "group_size": 4,
    "batch_size": 4,
    "learning_rate": 5e-4,
    "lora_rank": 8,
    "save_every": 0,
    "steps_per_eval": 0,
    "use_wandb": False,
    "seed": 0,
}
PER_ENV: dict[str, dict[str, Any]] = {
    "repeat_word": {"max_token_length": 8},
    # Small sums, and a system prompt showing the answer format: without it SmolLM2-135M
    # almost never writes \boxed{}, every reward is 0 and no loss has anything to learn from.
    "arithmetic": {
        "max_token_length": 24,
        "max_operand": 10,
        "operations": "+",
        "group_size": 8,  # a correct answer is rare at first: more tries per question
        "system_prompt": "Answer with just the number inside \\boxed{}, like \\boxed{7}.",
    },
}


@dataclass
class Curve:
    env: str
    loss: str
    advantage: str
    status: str = ""
    first_step_s: float | None = None  # POST /runs answered -> the run reports step 1
    wall_s: float = 0.0
    steps: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    correct: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.loss}/{self.advantage}"


def overrides(env: str, loss: str, advantage: str, steps: int) -> dict[str, Any]:
    body = {**COMMON, **PER_ENV[env], "total_steps": steps, "loss_fn": loss}
    body["advantage"] = advantage
    if advantage == "rebn":
        body["batch_size"] = body["batch_size"] * body["group_size"]
    return body


def train(http: httpx.Client, curve: Curve, body: dict[str, Any], poll_s: float) -> None:
    started = time.monotonic()
    created = http.post("/runs", json=body)
    if created.status_code != 200:
        raise SystemExit(f"POST /runs: HTTP {created.status_code}: {created.text}")
    run_id = created.json()["run_id"]
    posted = time.monotonic()
    while True:
        run = http.get(f"/runs/{run_id}").json()
        if curve.first_step_s is None and (run.get("step") or 0) >= 1:
            curve.first_step_s = time.monotonic() - posted
        if run["status"] in TERMINAL:
            break
        time.sleep(poll_s)
    curve.wall_s = time.monotonic() - started
    curve.status, curve.error = run["status"], run.get("error")
    keys = "reward/mean,env/percent_correct,time/step_s"
    rows = http.get(f"/runs/{run_id}/history", params={"keys": keys}).json()["rows"]
    for row in rows:
        if "reward/mean" in row:
            curve.steps.append(row["step"])
            curve.reward.append(row["reward/mean"])
            curve.correct.append(row.get("env/percent_correct", 0.0))
            curve.step_s.append(row.get("time/step_s", 0.0))


# A real run's shape for the end-to-end figure: the config's defaults (LoRA rank 32, its
# learning rate), 8 words x 8 tries, up to 64 new tokens each.
E2E = {
    "group_size": 8,
    "batch_size": 8,
    "max_token_length": 64,
    "save_every": 0,
    "steps_per_eval": 0,
    "use_wandb": False,
    "seed": 0,
}


def measure(args: argparse.Namespace) -> list[Curve]:
    curves = []
    with serving() as http:
        for env in args.envs:
            select(http, env)
            for loss in args.losses:
                for advantage in args.advantages:
                    curve = Curve(env, loss, advantage)
                    train(http, curve, overrides(env, loss, advantage, args.steps), 0.1)
                    curves.append(curve)
                    report_one(curve)
                    save(curves, args.out)
    return curves


def end_to_end(steps: int, model_name: str | None = None) -> Curve:
    """Seconds per step of a real run and POST /runs -> step 1, through the real server
    (`model_name`: a model folder or name instead of the config's default)."""
    body: dict[str, Any] = {**E2E, "total_steps": steps}
    if model_name is not None:
        body["model_name"] = model_name
    with serving() as http:
        select(http, "repeat_word")
        curve = Curve("repeat_word", "importance_sampling", "grpo")
        train(http, curve, body, 0.05)
    if curve.status != "succeeded":
        print(f"run {curve.status}: {curve.error}")
        return curve
    print(
        f"run {curve.status}: POST /runs -> step 1 {curve.first_step_s:.1f} s "
        "(start-up, model load, first step)"
    )
    for step, took, reward in zip(curve.steps, curve.step_s, curve.reward, strict=True):
        print(f"  step {step}: {took:.2f} s (reward {reward:.3f})")
    later = curve.step_s[1:] or curve.step_s
    print(f"median step after the first: {statistics.median(later):.2f} s; {machine()}")
    return curve


@contextlib.contextmanager
def serving(**env: str) -> Iterator[httpx.Client]:
    """The real server in a temporary var dir, sharing the converted SmolLM2 with `make serve`
    (converting is not what is timed); `env`: more of its settings (RLCS_...)."""
    with tempfile.TemporaryDirectory(prefix="rlcs-curves-") as tmp:
        models = os.environ.get("RLCS_MODELS_DIR", str(PROJECT_ROOT / "var" / "models"))
        with Server(Path(tmp), RLCS_MODELS_DIR=models, **env) as server:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                yield http
        if server.leftovers:
            print(f"left over after the server stopped (killed): {server.leftovers}")


def select(http: httpx.Client, env: str) -> None:
    selected = http.post(f"/environments/{env}/select")
    if selected.status_code != 200:
        raise SystemExit(f"select {env}: HTTP {selected.status_code}: {selected.text}")


def mean_of(values: list[float], part: slice) -> float:
    chosen = values[part]
    return statistics.fmean(chosen) if chosen else float("nan")


def report_one(curve: Curve) -> None:
    head, tail = slice(0, 3), slice(-3, None)
    print(
        f"{curve.env:12} {curve.label:26} {curve.status:9} "
        f"reward {mean_of(curve.reward, head):.3f} -> {mean_of(curve.reward, tail):.3f}  "
        f"correct {mean_of(curve.correct, head):.0%} -> {mean_of(curve.correct, tail):.0%}  "
        f"{statistics.median(curve.step_s) if curve.step_s else float('nan'):.1f} s/step  "
        f"first step {curve.first_step_s or float('nan'):.1f} s"
        + (f"  error: {curve.error}" if curve.error else ""),
        flush=True,
    )


def table(curves: list[Curve]) -> str:
    """Markdown: first three steps against the last three, per run."""
    lines = [
        "| env | loss / advantage | reward, steps 1-3 | reward, last 3 | correct, 1-3 | "
        "correct, last 3 | s per step | POST -> step 1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    head, tail = slice(0, 3), slice(-3, None)
    for c in curves:
        step_s = statistics.median(c.step_s) if c.step_s else float("nan")
        lines.append(
            f"| {c.env} | {c.label} | {mean_of(c.reward, head):.3f} | {mean_of(c.reward, tail):.3f}"
            f" | {mean_of(c.correct, head):.0%} | {mean_of(c.correct, tail):.0%} | {step_s:.1f} | "
            f"{c.first_step_s or float('nan'):.1f} s |"
        )
    return "\n".join(lines)


def figure(rows: int, cols: int, **options: Any) -> tuple[Any, Any]:
    """A matplotlib figure and its axes (`plt.subplots`), drawn for a file (no display)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, **options)


def save_figure(fig: Any, title: str, path: Path, dpi: int) -> None:
    """The figure titled and laid out, written to `path`, then closed."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot(curves: list[Curve], path: Path, title: str) -> None:
    envs = list(dict.fromkeys(c.env for c in curves))
    fig, axes = figure(2, len(envs), figsize=(6.5 * len(envs), 8), squeeze=False)
    colours = dict(zip(LOSSES, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    styles = {"grpo": "-", "rebn": "--"}
    for col, env in enumerate(envs):
        for c in (c for c in curves if c.env == env):
            kwargs = {"color": colours[c.loss], "linestyle": styles[c.advantage], "label": c.label}
            axes[0][col].plot(c.steps, c.reward, marker=".", **kwargs)
            axes[1][col].plot(c.steps, [100 * v for v in c.correct], marker=".", **kwargs)
        axes[0][col].set_title(env)
        axes[0][col].set_ylabel("mean reward")
        axes[1][col].set_ylabel("percent correct")
        axes[1][col].set_xlabel("step")
        for row in axes:
            row[col].grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="best")
    save_figure(fig, title, path, 110)


def save(curves: list[Curve], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine(), "settings": {"common": COMMON, "per_env": PER_ENV}}
    data["curves"] = [asdict(c) for c in curves]
    (out / "learning.json").write_text(json.dumps(data, indent=1))


def load(out: Path) -> tuple[list[Curve], str]:
    data = json.loads((out / "learning.json").read_text())
    return [Curve(**c) for c in data["curves"]], data["machine"]


def machine() -> str:
    cores = os.cpu_count()
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    return f"{when}, {cores} CPU cores, {platform.machine()}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--envs", type=lambda s: s.split(","), default=list(PER_ENV))
    parser.add_argument("--losses", type=lambda s: s.split(","), default=list(LOSSES))
    parser.add_argument("--advantages", type=lambda s: s.split(","), default=list(ADVANTAGES))
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--plot-only", action="store_true", help="redraw from learning.json")
    parser.add_argument("--e2e", action="store_true", help="time one real run's steps instead")
    args = parser.parse_args()
    if args.e2e:
        end_to_end(min(args.steps, 5))
        return
    unknown = set(args.envs) - set(PER_ENV) | set(args.losses) - set(LOSSES)
    unknown |= set(args.advantages) - set(ADVANTAGES)
    if unknown:
        raise SystemExit(f"unknown choices: {sorted(unknown)}")
    if args.plot_only:
        curves, when = load(args.out)
    else:
        curves, when = measure(args), machine()
    title = f"SmolLM2-135M-Instruct, local backend, LoRA rank 8, seed 0 ({when})"
    plot(curves, args.out / "learning.png", title)
    print(table(curves))
    print(f"wrote {args.out / 'learning.png'} and {args.out / 'learning.json'}")


if __name__ == "__main__":
    main()
