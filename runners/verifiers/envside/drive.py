"""A verifiers environment's driver: `<verifiers python> drive.py CONFIG_JSON`, run by path in
the verifiers interpreter, in the environment's folder (stdlib and verifiers only: nothing of
the project imports here). It loads the environment as verifiers' own trainers do (v0:
`vf.load_environment(id, **args)`; v1: its Env from its config), then plays the groups its
runner asks for against the run's inference face (v0: OpenAI chat completions with token ids,
as prime-rl asks; v1: vLLM's generate through verifiers' train client) and answers each with
the rollouts' tokens, rewards and metrics (core/verifiers_wire.py). End of input ends it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

KEY_VARIABLE = "RLCS_FACE_KEY"  # the face's key, read by verifiers' client (api_key_var)


def _load_helper() -> Any:
    """rlcs_v1.py beside this file (what the driver and the inspector share), by path."""
    import importlib.util

    path = Path(__file__).resolve().parent / "rlcs_v1.py"
    spec = importlib.util.spec_from_file_location("rlcs_v1", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helper = _load_helper()
log = logging.getLogger("rlcs.driver")


class Lines:
    """The protocol on a private copy of stdout; what the environment prints goes to stderr
    (the run's log)."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                os._exit(0)  # nobody reads: the runner is gone


def load(config: dict[str, Any]) -> Any:
    import verifiers as vf

    sys.path.insert(0, str(config["folder"]))
    return vf.load_environment(config["env_id"], **config.get("env_args", {}))


def splits(env: Any, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The train split shuffled by the run's seed, and the eval split (the train split's
    order when the environment has none)."""
    train = env.get_dataset(seed=seed).to_list()
    try:
        evaluation = env.get_eval_dataset().to_list()
    except ValueError:  # no eval dataset: verifiers evaluates on the train split then
        evaluation = env.get_dataset().to_list()
    return train, evaluation


def rollout_input(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as verifiers' RolloutInput (its own `task` routing left out: a plain
    string there is refused by 0.3)."""
    keep = ("prompt", "answer", "info", "example_id")
    return {k: row[k] for k in keep if k in row and row[k] is not None}


def step_tokens(step: dict[str, Any]) -> dict[str, Any] | None:
    tokens = step.get("tokens")
    if not tokens:
        return None
    return {
        "prompt_ids": [int(t) for t in tokens["prompt_ids"]],
        "completion_ids": [int(t) for t in tokens["completion_ids"]],
        "completion_logprobs": [float(x) for x in tokens["completion_logprobs"]],
        "completion_mask": [int(m) for m in tokens["completion_mask"]],
    }


def messages(value: Any) -> list[dict[str, Any]] | str:
    if isinstance(value, str):
        return value
    return [m for m in helper.plain(list(value or [])) if isinstance(m, dict)]


def rollout_answer(output: dict[str, Any]) -> dict[str, Any]:
    steps = [s for s in (step_tokens(x) for x in output.get("trajectory") or []) if s]
    error = output.get("error")
    metrics = {
        str(k): float(v)
        for k, v in (output.get("metrics") or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return {
        "reward": float(output.get("reward") or 0.0),
        "metrics": metrics,
        "steps": steps,
        "prompt": messages(output.get("prompt")),
        "completion": messages(output.get("completion")),
        "answer": output.get("answer") if isinstance(output.get("answer"), str) else None,
        "truncated": bool(output.get("is_truncated")),
        "error": None if not error else json.dumps(error, default=str)[:2000],
    }


class V0Player:
    """A v0 environment: `vf.load_environment(id, **args)`, its dataset's rows played with
    `run_group` through verifiers' OpenAI client (prime-rl's sampling arguments)."""

    def __init__(self, config: dict[str, Any]) -> None:
        import verifiers as vf

        self.env = load(config)
        self.env_type = type(self.env).__name__
        self.model = config["model"]
        self.train, self.evaluation = splits(self.env, int(config.get("seed", 0)))
        self.examples, self.eval_examples = len(self.train), len(self.evaluation)
        self.client = vf.ClientConfig(
            client_type="openai_chat_completions",
            api_base_url=config["base_url"],
            api_key_var=KEY_VARIABLE,
            max_retries=0,
            timeout=float(config.get("timeout_s", 3600)),
        )

    async def start(self) -> None:
        pass

    async def play(self, example: int, size: int, split: str, sampling: dict[str, Any]) -> list:
        rows = self.train if split == "train" else self.evaluation
        if not rows:
            raise ValueError("the environment's dataset is empty")
        inputs = [rollout_input(rows[example % len(rows)]) for _ in range(size)]
        outputs = await self.env.run_group(
            inputs, self.client, self.model, dict(sampling), state_columns=["trajectory"]
        )
        return [rollout_answer(dict(o)) for o in outputs]


class V1Player:
    """A v1 environment: its Env built from its config (every role on the subprocess runtime
    with the null harness, rlcs_v1.py), its taskset's tasks played with `run_episode` through
    verifiers' train client (the face's /inference/v1/generate, rendered with the run's own
    tokenizer folder); each seat's trace is a rollout."""

    def __init__(self, config: dict[str, Any]) -> None:
        import verifiers.v1 as vf

        sys.path.insert(0, str(config["folder"]))
        self.env = vf.load_environment(helper.run_config(config["env_id"], config["env_args"]))
        self.env_type = type(self.env).__name__
        self.tasks = helper.Tasks(self.env.taskset, int(config.get("seed", 0)))
        self.examples = self.eval_examples = self.tasks.count()
        self.model = config["model"]
        self.client = vf.TrainClientConfig(
            base_url=config["base_url"],
            api_key_var=KEY_VARIABLE,
            renderer_model_name=config["tokenizer_dir"],
            renderer=renderer_for(self.model),
        )
        self._serving: Any = None

    async def start(self) -> None:
        """The env's serving resources (its interception endpoint), for the driver's life."""
        install_uv_once()
        self._serving = self.env.serving()
        await self._serving.__aenter__()

    async def play(self, example: int, size: int, split: str, sampling: dict[str, Any]) -> list:
        import verifiers.v1 as vf

        task = self.tasks.pick(example, split)
        wanted = {k: sampling[k] for k in ("temperature", "top_p", "max_tokens") if k in sampling}
        ctx = vf.ModelContext(
            model=self.model, client=self.client, sampling=vf.SamplingConfig(**wanted)
        )
        episodes = await asyncio.gather(*(self.env.run_episode(task, ctx) for _ in range(size)))
        rollouts = []
        for episode in episodes:
            traces = list(episode.traces)
            if not traces:
                rollouts.append(helper.failed_rollout(episode.errors))
            rollouts += [helper.trace_rollout(t, list(episode.errors)) for t in traces]
        return rollouts


def renderer_for(model: str) -> dict[str, str] | None:
    """The renderer of the model's family, by its hub id (renderers' own map), where one is
    known: the tokenizer comes from a local folder, whose path renderers cannot map (it would
    fall back to the default renderer, which has no tool format). None: renderers decides."""
    from renderers.base import MODEL_RENDERER_MAP

    name = MODEL_RENDERER_MAP.get(model)
    return {"name": name} if name else None


class Driver:
    def __init__(self, player: Any, lines: Lines) -> None:
        self.player = player
        self.lines = lines

    async def roll(self, request: dict[str, Any]) -> None:
        example = int(request["example"])
        try:
            rollouts = await self.player.play(
                example,
                int(request["size"]),
                request.get("split", "train"),
                request["sampling"],
            )
            answer = {
                "kind": "group",
                "id": request["id"],
                "example": example,
                "rollouts": rollouts,
            }
        except Exception as exc:
            traceback.print_exc()
            answer = {"kind": "failed", "id": request["id"], "error": _why(exc)}
        self.lines.send(answer)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def install_uv_once() -> None:
    """The null harness's runtime installs uv into $HOME/.local/bin (`pip install -U --user
    uv`) before its first script, in every rollout; $HOME is shared by the server's runs, and a
    rollout that runs uv while another's first install still writes it fails ("uv: Permission
    denied"). The first install happens here, one driver at a time; the rollouts' own then find
    uv installed and change nothing."""
    home = Path(os.environ["HOME"])
    pip = shutil.which("pip")
    if pip is None:
        return  # the runtime falls back to its own installer, as it would anyway
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".uv-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / ".local" / "bin" / "uv").exists():
            return
        bin_dir = str(home / ".local" / "bin")
        subprocess.run(
            [pip, "install", "-q", "-U", "--user", "uv"],
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    lines = Lines()
    config = json.loads(Path(argv[0]).read_text())
    loop = asyncio.new_event_loop()
    try:
        player = V0Player(config) if config.get("generation", "v0") == "v0" else V1Player(config)
        loop.run_until_complete(player.start())
    except BaseException as exc:  # an environment's SystemExit too: say why, then go
        traceback.print_exc()
        lines.send({"kind": "failed", "id": None, "error": _why(exc)})
        return 1
    driver = Driver(player, lines)
    lines.send(
        {
            "kind": "ready",
            "env_type": player.env_type,
            "examples": player.examples,
            "eval_examples": player.eval_examples,
        }
    )
    running: set[asyncio.Task[None]] = set()

    def start(request: dict[str, Any]) -> None:
        task = loop.create_task(driver.roll(request))
        running.add(task)
        task.add_done_callback(running.discard)

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(start, json.loads(line))
        os._exit(0)  # end of input: the runner is gone or done with us

    threading.Thread(target=read, daemon=True, name="lines in").start()
    loop.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
