"""What the verifiers inspector and driver share (loaded by path; stdlib and verifiers only):
messages as JSON, and about v1 environments (a `Taskset`, an `Env`; verifiers' `v1` API as 0.3
ships it): the config
fields that are the environment's own (its taskset's and its Env config's, by name), the whole
config a run uses (every role on the `subprocess` runtime with the `null` harness, which this
server can run), and an episode's traces as the rollouts the runner reads.
"""

from __future__ import annotations

import json
from typing import Any

# What the server fixes on every role, and why (shown as the config's locked fields).
LOCKED = {
    "runtime": "subprocess: Prime's remote sandboxes are out of this server's reach",
    "harness": "null (a plain chat loop): code-running harnesses need a sandbox or a tool "
    "renderer this server does not give",
}


def base_config(module: str) -> Any:
    """The environment's config with every default, narrowed to its own classes."""
    import verifiers.v1 as vf

    return vf.resolve_env_config({"taskset": {"id": module}})


def own_fields(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The taskset config's own fields and the Env config's (neither the framework's nor a
    role's), by name: pydantic FieldInfo each."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.env import EnvConfig
    from verifiers.v1.configs.taskset import TasksetConfig

    taskset = {
        name: info
        for name, info in type(config.taskset).model_fields.items()
        if name not in TasksetConfig.model_fields
    }
    env = {
        name: info
        for name, info in type(config).model_fields.items()
        if name not in EnvConfig.model_fields
        and not isinstance(getattr(config, name, None), vf.AgentConfig)
    }
    return taskset, env


def run_config(module: str, args: dict[str, Any]) -> Any:
    """The config a run plays: `args` placed where they belong (the taskset's fields under
    taskset), every role on the subprocess runtime with the null harness."""
    import verifiers.v1 as vf

    config = base_config(module)
    taskset_fields, _ = own_fields(config)
    raw = config.model_dump(mode="json")
    for name, value in args.items():
        if name in taskset_fields:
            raw["taskset"][name] = value
        else:
            raw[name] = value
    for name in list(raw):
        if isinstance(getattr(config, name, None), vf.AgentConfig):
            raw[name]["runtime"] = {"type": "subprocess"}
            raw[name]["harness"] = {"id": "null"}
    return vf.resolve_env_config(raw)


class Tasks:
    """A taskset's tasks in the order a run takes them: a finite taskset's shuffled by the
    run's seed (its eval order as loaded); an infinite one's (`Taskset.INFINITE`: a generator
    that never ends, Kuhn poker's hands) drawn as far as asked, in order, both splits alike."""

    def __init__(self, taskset: Any, seed: int) -> None:
        import random

        self.infinite = bool(getattr(type(taskset), "INFINITE", False))
        self._stream = iter(taskset.load())
        self._drawn: list[Any] = []
        self.train: list[Any] = []
        if not self.infinite:
            self._drawn = list(self._stream)
            self.train = list(self._drawn)
            random.Random(seed).shuffle(self.train)

    def count(self) -> int:
        """How many there are (0: no end)."""
        return 0 if self.infinite else len(self._drawn)

    def pick(self, index: int, split: str) -> Any:
        if self.infinite:
            while len(self._drawn) <= index:
                self._drawn.append(next(self._stream))
            return self._drawn[index]
        tasks = self.train if split == "train" else self._drawn
        if not tasks:
            raise ValueError("the environment's taskset has no tasks")
        return tasks[index % len(tasks)]


def first_task(taskset: Any) -> Any:
    """Its first task, or None (an infinite taskset is not drawn further)."""
    return next(iter(taskset.load()), None)


def plain(value: Any) -> Any:
    """Messages, errors and the like as JSON: verifiers keeps them as pydantic models."""
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(mode="json", exclude_none=True))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def trace_rollout(trace: Any, episode_errors: list[Any]) -> dict[str, Any]:
    """One seat's trace as a rollout: each branch's tokens with what the model sampled of
    them and the sampler's logprobs, its reward, the rewards' and metrics' values, the chat."""
    steps = []
    for branch in trace.branches:
        tokens = [int(t) for t in branch.token_ids]
        logprobs = [float(x or 0.0) for x in branch.spread(lambda node: node.logprobs)]
        steps.append(
            {
                "prompt_ids": [],
                "completion_ids": tokens,
                "completion_logprobs": logprobs,
                "completion_mask": [1 if m else 0 for m in branch.sampled_mask],
            }
        )
    metrics = {
        name: float(reward.score) for name, reward in trace.rewards.items() if reward is not None
    }
    metrics.update({k: float(v) for k, v in trace.metrics.items() if v is not None})
    messages = [m for m in plain(list(trace.messages)) if isinstance(m, dict)]
    first_reply = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    errors = [*trace.errors, *episode_errors]
    return {
        "reward": float(trace.reward),
        "metrics": metrics,
        "steps": steps,
        "prompt": messages[:first_reply] if first_reply is not None else messages,
        "completion": messages[first_reply:] if first_reply is not None else [],
        "answer": None,
        "truncated": False,
        "error": json.dumps(plain(errors[0]))[:2000] if errors else None,
    }


def failed_rollout(episode_errors: list[Any]) -> dict[str, Any]:
    """An episode that ended with no trace at all (its setup or run failed): a rollout that
    says why and trains on nothing."""
    why = json.dumps(plain(episode_errors[0]))[:2000] if episode_errors else "no trace"
    return {
        "reward": 0.0,
        "metrics": {},
        "steps": [],
        "prompt": [],
        "completion": [],
        "answer": None,
        "truncated": False,
        "error": why,
    }
