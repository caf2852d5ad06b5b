"""Two engine hosts on one device against one (issue 52): two RL runs on two different base
models, each in a process of its own with its own `EngineService` client as a run's process has
one, first both in ONE engine host (it holds both bases), then in TWO hosts on the same device
(placement puts each base on its own host; on a GPU they halve its memory budget, on the CPU
they split its cores), against hosts this script starts in a temporary var/ folder and stops
after each case.

Each run: a LoRA client (rank 8, its own seed), one warm-up step, then `--steps` RL steps
measured while both runs take them at once: a snapshot sampler of the current weights, `--batch`
prompts x `--group` samples of up to `--tokens` new tokens, importance-sampling forward_backward
on those samples, optim_step. Printed for each case: each run's step time (its sampling and its
training), the summed training tokens/s (each run's trained tokens over its own training
seconds, summed; and all trained tokens over the measured wall time), and where each base landed
(the hosts' own status); then the ratio two hosts / one host. Issue 52's GPU goal: two hosts on
one GPU, both runs finish, summed training tokens/s at least 0.9x the same two runs in one host.

Bases: a model and a copy of it in another folder (a different path is a different base to the
hosts), or two models (`--models a,b`). `random-…` shapes (benchmarks/local_backend.py) are
built here with random weights, once, and linked under a second name.

Run from the repo root:
    .venv/bin/python -m benchmarks.host_pair --smoke        # tiny-random and a copy, a minute
    .venv/bin/python -m benchmarks.host_pair --rounds 2     # SmolLM2 and a copy, 12 minutes
    python3 -m benchmarks.host_pair --device cuda           # a GPU: the 1.5B shape twice
(2 CPU cores: most of a SmolLM2 round is its 4 steps of 16 x 32 tokens, two runs at once;
`benchmarks/gpu_check.sh hosts` runs the GPU figures.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MARK = "HOST-PAIR "  # a run process's lines for this script (its other output passes through)
LORA_RANK = 8
# The hosts' idle exit: this script stops them after each case, this ends ones it could not
# (it was killed at its timeout) soon after their runs' processes end.
IDLE_S = 30.0
GIB = float(1 << 30)
# Each device's defaults: (models, group, batch, tokens, steps). On the GPU 96 rows x 64 tokens
# a run (the other GPU goals sample 64 x 64; more rows give training a larger share of the
# step), two 1.5B passes of about 10k tokens at once within about 70 GB; on 2 CPU cores a
# SmolLM2 step of 16 x 32 takes 25 to 45 s with two runs training at once.
DEFAULTS = {
    "cpu": ("smollm2", 8, 2, 32, 3),
    "cuda": ("random-1.5b", 16, 6, 64, 8),
}
SMOKE = ("tiny-random", 4, 2, 8, 2)


@dataclass(frozen=True)
class Step:
    sample_s: float  # the snapshot sampler and its samples
    train_s: float  # forward_backward and optim_step, each until answered
    trained_tokens: int  # the datums' input tokens
    sampled_tokens: int


@dataclass(frozen=True)
class RunResult:
    base: str
    host: str  # the host its client was placed on
    steps: list[Step]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        steps = [Step(**step) for step in data["steps"]]
        return cls(data["base"], data["host"], steps)

    def trained_tokens(self) -> int:
        return sum(s.trained_tokens for s in self.steps)

    def train_s(self) -> float:
        return sum(s.train_s for s in self.steps)

    def training_rate(self) -> float:
        return self.trained_tokens() / self.train_s()

    def sampling_rate(self) -> float:
        return sum(s.sampled_tokens for s in self.steps) / sum(s.sample_s for s in self.steps)


@dataclass(frozen=True)
class HostSeen:
    """A host after the warm-up, as its own status says."""

    bases: list[str]
    rss_gib: float
    budget_gib: float | None
    free_gib: float | None  # its GPU's free memory (None on the CPU)


@dataclass(frozen=True)
class Case:
    label: str
    hosts: str  # RLCS_ENGINE_HOSTS
    runs: list[RunResult]
    wall_s: float  # from the go to the last run's end
    setup_s: float  # from the runs' start to both ready: hosts started, bases loaded, warm-up
    placement: dict[str, HostSeen]  # by the host's name

    def summed_rate(self) -> float:
        return sum(run.training_rate() for run in self.runs)

    def wall_rate(self) -> float:
        return sum(run.trained_tokens() for run in self.runs) / self.wall_s


# The run's process ------------------------------------------------------------------------


def run_process(args: argparse.Namespace) -> None:
    """One run, as a run's process holds it: its settings from the environment, a client on the
    host placed for its base, a warm-up step; then the measured steps once told to go."""
    from tinker import types

    from core.settings import Settings
    from runners.backends.engine_backend import EngineService

    settings = Settings()
    base, seed = args.run_base, args.run_seed
    service = EngineService(settings, f"pair-{seed}", Path(args.run_folder), base_model=base)
    try:
        trainer = service.create_lora_training_client(base, rank=LORA_RANK, seed=seed).result()
        prompts = prompts_for(trainer, args.batch, seed)
        adam = types.AdamParams(learning_rate=1e-5)
        rl_step(trainer, prompts, args, adam, seed=0)  # loads, allocates: not measured
        say({"ready": service.host})
        if sys.stdin.readline().strip() != "go":
            return  # the benchmark ended without measuring
        steps = [rl_step(trainer, prompts, args, adam, seed=i + 1) for i in range(args.steps)]
        say({"result": asdict(RunResult(base, service.host, steps))})
    finally:
        service.close()


def say(message: dict[str, Any]) -> None:
    print(MARK + json.dumps(message), flush=True)


def prompts_for(trainer: Any, count: int, seed: int) -> list[list[int]]:
    """Random token prompts of 32 to 48 tokens within the base's tokenizer (the random shapes'
    byte tokenizer has 259 tokens; their vocabularies are larger, so any id of it is valid)."""
    import torch

    vocab = len(trainer.get_tokenizer())
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, 49, (count,), generator=generator)
    return [torch.randint(100, vocab, (int(n),), generator=generator).tolist() for n in lengths]


def rl_step(
    trainer: Any, prompts: list[list[int]], args: argparse.Namespace, adam: Any, seed: int
) -> Step:
    """Sample a group per prompt with a snapshot of the current weights, then train on them."""
    from tinker import types

    from benchmarks.rl_data import importance_data

    started = time.perf_counter()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=seed, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), args.group, params) for p in prompts]
    responses = [future.result() for future in futures]
    sampled = time.perf_counter()
    data = importance_data(prompts, responses)
    trainer.forward_backward(data, "importance_sampling").result()
    trainer.optim_step(adam).result()
    trained = time.perf_counter()
    return Step(
        sample_s=sampled - started,
        train_s=trained - sampled,
        trained_tokens=sum(d.model_input.length for d in data),
        sampled_tokens=sum(len(s.tokens) for r in responses for s in r.sequences),
    )


# The bases ------------------------------------------------------------------------------


def prepare_bases(args: argparse.Namespace, folder: Path) -> tuple[str, str]:
    """The two bases' names: `--models a,b` as they are (random shapes built), or one model and
    a copy of it in another folder."""
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    names = list(dict.fromkeys(names))  # a model named twice: it and a copy (one folder)
    if len(names) == 2:
        return resolve(names[0], folder), resolve(names[1], folder)
    if len(names) != 1:
        raise SystemExit(f"--models takes one model or two, comma-separated; got {args.models!r}")
    first = resolve(names[0], folder)
    return first, copy_of(first, folder / "copy", args)


def resolve(name: str, folder: Path) -> str:
    from benchmarks.local_backend import ALIASES, RANDOM_SHAPES

    if name in RANDOM_SHAPES:
        return built_random(name, folder)
    return ALIASES.get(name, name)


def built_random(shape: str, folder: Path) -> str:
    """A random-weight shape saved in `folder`, built on the GPU where there is one; the GPU
    memory it took goes back before the hosts start."""
    import gc

    import torch

    from benchmarks.local_backend import build_random

    path = build_random(shape, folder)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return path


def copy_of(base: str, target: Path, args: argparse.Namespace) -> str:
    """`base` under another folder: its files linked (copied across file systems); tiny-random,
    which has no folder, saved there."""
    from core.model_names import SMOLLM2, TINY_RANDOM, local_folder, smollm2_converted_dir

    if base == TINY_RANDOM:
        return saved_tiny(target)
    source = smollm2_converted_dir(Path(args.models_dir)) if base == SMOLLM2 else local_folder(base)
    if source is None or not (source / "config.json").is_file():
        raise SystemExit(
            f"{base} has no model folder here to copy (SmolLM2: run make install first); "
            "name two models with --models a,b"
        )
    shutil.copytree(source, target, copy_function=link_or_copy)
    return str(target)


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def saved_tiny(target: Path) -> str:
    from runners.models.tiny import build_tiny

    model, tokenizer = build_tiny()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


# The cases ------------------------------------------------------------------------------


def host_choices(args: argparse.Namespace) -> tuple[str, str]:
    """RLCS_ENGINE_HOSTS for one host and for two on the same device. On a GPU: a count of one
    (the first visible GPU; "0", that GPU by name, is read as a count of none) and that GPU
    named twice."""
    if args.device == "cpu":
        return "1", "2"
    gpu = first_gpu()
    return "1", f"{gpu},{gpu}"


def first_gpu() -> str:
    return (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()


def settings_for(args: argparse.Namespace, var_dir: Path, hosts: str) -> Settings:
    from core.settings import Settings

    # On a GPU, the one the hosts share named outright: the plan then needs no driver listing.
    return Settings(
        var_dir=var_dir,
        models_path=Path(args.models_dir),
        device=args.device,
        engine_hosts=hosts,
        cuda_visible_devices=None if args.device == "cpu" else first_gpu(),
        engine_idle_s=IDLE_S,
    )


def measure_case(
    label: str, hosts: str, bases: tuple[str, str], args: argparse.Namespace, home: Path
) -> Case:
    """The two runs at once against hosts of their own in `home`/var (started by the first
    client), then the hosts stopped."""
    from core import engine_host

    settings = settings_for(args, home / "var", hosts)
    env = settings.child_environment()  # a run's, as the server gives it: RLCS_* variables
    if settings.cuda_visible_devices is not None:  # the runs must plan the same hosts
        env["CUDA_VISIBLE_DEVICES"] = settings.cuda_visible_devices
    runs: list[subprocess.Popen[str]] = []
    begun = time.perf_counter()
    try:
        runs = [start_run(args, base, seed, home, env) for seed, base in enumerate(bases)]
        for run in runs:
            read_mark(run, "ready")
        setup = time.perf_counter() - begun
        placement = placed(settings)
        started = time.perf_counter()
        for run in runs:
            assert run.stdin is not None
            run.stdin.write("go\n")
            run.stdin.flush()
        results = [RunResult.from_json(read_mark(run, "result")) for run in runs]
        wall = time.perf_counter() - started
        for run in runs:
            if run.wait(timeout=60) != 0:
                raise SystemExit(f"{label}: a run's process exited with {run.returncode}")
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
        engine_host.stop(settings.var_dir)
        if args.host_logs:
            keep_logs(settings, home.name, Path(args.host_logs))
    return Case(label, hosts, results, wall, setup, placement)


def start_run(
    args: argparse.Namespace, base: str, seed: int, home: Path, env: dict[str, str]
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "benchmarks.host_pair", "--device", args.device]
    command += ["--steps", str(args.steps), "--group", str(args.group)]
    command += ["--batch", str(args.batch), "--tokens", str(args.tokens)]
    command += ["--run-base", base, "--run-seed", str(seed)]
    command += ["--run-folder", str(home / f"run-{seed}")]
    return subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def read_mark(run: subprocess.Popen[str], key: str) -> Any:
    """The run's next line for this script carrying `key` (other lines are echoed)."""
    stdout: IO[str] | None = run.stdout
    assert stdout is not None
    for line in stdout:
        if not line.startswith(MARK):
            sys.stdout.write(line)
            continue
        message = json.loads(line[len(MARK) :])
        if key in message:
            return message[key]
    code = run.wait()
    raise SystemExit(f"a run's process ended (exit {code}) before it said {key!r}: see above")


def placed(settings: Settings) -> dict[str, HostSeen]:
    """Each host as its own status says (a probe: no client made)."""
    from core.engine_placement import views

    seen = {}
    for view in views(settings):
        status = view.status
        if status is None:
            seen[view.slot.name] = HostSeen([], 0.0, None, None)
            continue
        seen[view.slot.name] = HostSeen(
            bases=[b.name for b in status.bases],
            rss_gib=status.rss_bytes / GIB,
            budget_gib=None if status.budget_bytes is None else status.budget_bytes / GIB,
            free_gib=None if status.device_free_bytes is None else status.device_free_bytes / GIB,
        )
    return seen


def keep_logs(settings: Settings, case: str, target: Path) -> None:
    """Each host's log, copied out of the temporary folder (`--host-logs`): a host that failed
    says why only there."""
    from core import engine_host
    from core.engine_slots import plan

    target.mkdir(parents=True, exist_ok=True)
    for slot in plan(settings):
        log = engine_host.log_path(settings.var_dir, slot)
        if log.is_file():
            shutil.copyfile(log, target / f"hosts-{case}-host{slot.index}.log")


# Printing -------------------------------------------------------------------------------


def print_case(case: Case, bases: tuple[str, str]) -> None:
    print(
        f"\n{case.label} (RLCS_ENGINE_HOSTS={case.hosts}; hosts started, bases loaded and a "
        f"warm-up step in {case.setup_s:.1f} s):"
    )
    for name, host in case.placement.items():
        shown = ", ".join(short(b, bases) for b in host.bases) or "nothing"
        budget = "none" if host.budget_gib is None else f"{host.budget_gib:.1f} GiB"
        free = "" if host.free_gib is None else f", its GPU {host.free_gib:.1f} GiB free"
        print(f"  host {name} holds {shown} (budget {budget}; {host.rss_gib:.2f} GiB RSS{free})")
    for run in case.runs:
        mean = statistics.fmean
        print(
            f"  run on {short(run.base, bases)} (host {run.host}): step "
            f"{mean(s.sample_s + s.train_s for s in run.steps):.2f} s (sampling "
            f"{mean(s.sample_s for s in run.steps):.2f}, training "
            f"{mean(s.train_s for s in run.steps):.2f}), "
            f"{run.trained_tokens() // len(run.steps)} trained tokens a step, "
            f"{run.training_rate():.0f} training tokens/s, {run.sampling_rate():.0f} sampled "
            "tokens/s"
        )
    print(
        f"  summed training tokens/s: {case.summed_rate():.0f}; over the wall time: "
        f"{case.wall_rate():.0f} ({sum(r.trained_tokens() for r in case.runs)} tokens in "
        f"{case.wall_s:.1f} s)"
    )


def short(base: str, bases: tuple[str, str]) -> str:
    return "base A" if base == bases[0] else "base B" if base == bases[1] else base


def placement_ok(case: Case, bases: tuple[str, str], apart: bool) -> bool:
    """Whether each base is held by exactly one host, and (`apart`) the two by different ones
    (the runs' own view of their host agreeing)."""
    holders = {b: [h for h, seen in case.placement.items() if b in seen.bases] for b in bases}
    if any(len(h) != 1 for h in holders.values()):
        return False
    by_runs = {run.base: run.host for run in case.runs}
    if any(by_runs.get(b) != h[0] for b, h in holders.items()):
        return False
    return (holders[bases[0]] != holders[bases[1]]) == apart


# Main -----------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", help="one model (and a copy of it) or two, comma-separated")
    parser.add_argument("--steps", type=int, help="measured RL steps per run (after a warm-up)")
    parser.add_argument("--group", type=int, help="samples per prompt")
    parser.add_argument("--batch", type=int, help="prompts per step")
    parser.add_argument("--tokens", type=int, help="new tokens per sample, at most")
    parser.add_argument("--smoke", action="store_true", help="tiny-random, 2 short steps")
    parser.add_argument("--rounds", type=int, default=1, help="both cases, in turn; the best")
    parser.add_argument("--models-dir", default=str(PROJECT_ROOT / "var" / "models"))
    parser.add_argument("--host-logs", help="a folder to copy each case's host logs to")
    for hidden in ("--run-base", "--run-seed", "--run-folder"):  # a run's process
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    defaults = SMOKE if args.smoke else DEFAULTS[args.device]
    for key, value in zip(("models", "group", "batch", "tokens", "steps"), defaults, strict=True):
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.group, args.batch, args.tokens, args.steps, args.rounds) < 1:
        parser.error("--steps, --group, --batch, --tokens and --rounds must be at least 1")
    if args.run_seed is not None:
        args.run_seed = int(args.run_seed)
    return args


def check_device(args: argparse.Namespace) -> None:
    """Refuse at once, saying why, a device this machine lacks (not in a host's log later)."""
    if args.device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            f"--device cuda: CUDA is not available here (torch {torch.__version__}, "
            f"{torch.cuda.device_count()} GPU(s)); run with --device cpu, or on a GPU machine "
            "(benchmarks/gpu_check.sh hosts)"
        )


def main() -> None:
    args = parse()
    if args.run_base is not None:
        run_process(args)
        return
    check_device(args)
    # A timeout's SIGTERM unwinds like an error: the hosts are stopped, the folder removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from core.engine_host import HostUnavailable
    from core.engine_slots import SlotsRefused

    one, two = host_choices(args)
    with tempfile.TemporaryDirectory(prefix="host-pair-") as tmp:
        folder = Path(tmp)
        bases = prepare_bases(args, folder)
        print(
            f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"{args.device}; base A {bases[0]}, base B {bases[1]}; 2 runs x {args.steps} RL "
            f"steps ({args.batch} prompts x {args.group} samples x {args.tokens} tokens), "
            f"LoRA rank {LORA_RANK}",
            flush=True,
        )
        rounds: list[tuple[Case, Case]] = []
        try:
            # The two cases in turn, each round: a change in the machine's load falls on both.
            for i in range(args.rounds):
                pair = (
                    measure_case("one host", one, bases, args, folder / f"one-{i}"),
                    measure_case("two hosts", two, bases, args, folder / f"two-{i}"),
                )
                rounds.append(pair)
                if args.rounds > 1:
                    print_round(i, pair)
        except (SlotsRefused, HostUnavailable) as exc:
            raise SystemExit(f"the engine hosts could not serve the benchmark: {exc}") from exc
    report(rounds, bases)


def print_round(i: int, pair: tuple[Case, Case]) -> None:
    one, two = pair
    print(
        f"round {i + 1}: summed training tokens/s {one.summed_rate():.0f} in one host, "
        f"{two.summed_rate():.0f} in two ({two.summed_rate() / one.summed_rate():.2f}x)",
        flush=True,
    )


def report(rounds: list[tuple[Case, Case]], bases: tuple[str, str]) -> None:
    """The best round of each case (by summed training tokens/s), the ratio of those, and
    whether every round placed the bases as it should."""
    one = max((pair[0] for pair in rounds), key=Case.summed_rate)
    two = max((pair[1] for pair in rounds), key=Case.summed_rate)
    if len(rounds) > 1:
        print(f"\nthe best of {len(rounds)} rounds of each:")
    print_case(one, bases)
    print_case(two, bases)
    together = all(placement_ok(pair[0], bases, False) for pair in rounds)
    apart = all(placement_ok(pair[1], bases, True) for pair in rounds)
    summed, wall = two.summed_rate() / one.summed_rate(), two.wall_rate() / one.wall_rate()
    print(
        f"\ntwo hosts / one host: summed training tokens/s {summed:.2f}x (goal at least 0.9x), "
        f"over the wall time {wall:.2f}x"
    )
    print(f"one host holds both bases: {'yes' if together else 'NO'}")
    print(f"two hosts hold a base each: {'yes' if apart else 'NO'}")
    if not (together and apart):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
