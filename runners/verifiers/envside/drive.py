"""A verifiers environment's driver: `<verifiers python> drive.py CONFIG_JSON`, run by path in
the verifiers interpreter, in the environment's folder (stdlib and verifiers only: nothing of
the project imports here). It loads the environment as verifiers' own trainers do
(`vf.load_environment(id, **args)`), then plays the groups its runner asks for against the run's
inference face (OpenAI chat completions with token ids, as prime-rl asks) and answers each with
the rollouts' tokens, rewards and metrics (core/verifiers_wire.py). End of input ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

KEY_VARIABLE = "RLCS_FACE_KEY"  # the face's key, read by verifiers' client (api_key_var)
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


def plain(value: Any) -> Any:
    """Messages as JSON: verifiers 0.3 keeps them as pydantic models."""
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(mode="json", exclude_none=True))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def messages(value: Any) -> list[dict[str, Any]] | str:
    if isinstance(value, str):
        return value
    return [m for m in plain(list(value or [])) if isinstance(m, dict)]


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


class Driver:
    def __init__(self, env: Any, config: dict[str, Any], lines: Lines) -> None:
        import verifiers as vf

        self.env = env
        self.lines = lines
        self.model = config["model"]
        self.train, self.evaluation = splits(env, int(config.get("seed", 0)))
        self.client = vf.ClientConfig(
            client_type="openai_chat_completions",
            api_base_url=config["base_url"],
            api_key_var=KEY_VARIABLE,
            max_retries=0,
            timeout=float(config.get("timeout_s", 3600)),
        )

    async def roll(self, request: dict[str, Any]) -> None:
        rows = self.train if request.get("split", "train") == "train" else self.evaluation
        example = int(request["example"])
        try:
            if not rows:
                raise ValueError("the environment's dataset is empty")
            row = rows[example % len(rows)]
            inputs = [rollout_input(row) for _ in range(int(request["size"]))]
            outputs = await self.env.run_group(
                inputs,
                self.client,
                self.model,
                dict(request["sampling"]),
                state_columns=["trajectory"],
            )
            answer = {
                "kind": "group",
                "id": request["id"],
                "example": example,
                "rollouts": [rollout_answer(dict(o)) for o in outputs],
            }
        except Exception as exc:
            traceback.print_exc()
            answer = {"kind": "failed", "id": request["id"], "error": _why(exc)}
        self.lines.send(answer)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    lines = Lines()
    config = json.loads(Path(argv[0]).read_text())
    try:
        env = load(config)
        driver = Driver(env, config, lines)
    except BaseException as exc:  # an environment's SystemExit too: say why, then go
        traceback.print_exc()
        lines.send({"kind": "failed", "id": None, "error": _why(exc)})
        return 1
    lines.send(
        {
            "kind": "ready",
            "env_type": type(env).__name__,
            "examples": len(driver.train),
            "eval_examples": len(driver.evaluation),
        }
    )
    loop = asyncio.new_event_loop()
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
