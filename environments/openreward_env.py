"""Adapter for OpenReward environments: a hosted `Org/Name` (needs OPENREWARD_API_KEY) or one
served on loopback (`base_url`). The model calls tools in text (Qwen <tool_call> JSON); each
call's reward is reduced over the episode (sum/mean/max/min)."""

from __future__ import annotations

import json
import logging
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.net import is_loopback
from environments.base import BaseEnv, EnvConfig, EnvContext, Split, StepResult
from environments.support import toolcalls
from environments.support.openreward_client import make_client, pick_task
from environments.support.openreward_upload import Transcript, submit
from environments.support.pkgsrc import require

# Cheap (finds, does not import): a missing extra shows as "not importable" in the listing.
require("openreward", "openreward")

log = logging.getLogger(__name__)
API_KEY_NAME = "OPENREWARD_API_KEY"  # the key this environment takes from its EnvContext
_warned_eval_on_train: set[str] = set()

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$"


class SplitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shuffle: bool = Field(True, description="With num_samples: pick a fixed random subset")
    num_samples: int | None = Field(None, ge=1, description="Use only this many tasks (null: all)")


class OpenRewardConfig(EnvConfig):
    # Not `environment`: POST /runs uses that key to pick the environment to run.
    env_name: str = Field(
        "GeneralReasoning/WhoDunIt",
        max_length=200,
        pattern=_NAME,
        description="Org/Name (hosted, needs OPENREWARD_API_KEY) or a name served at base_url",
    )
    base_url: str | None = Field(
        None, max_length=200, description="A loopback ORS server, e.g. http://127.0.0.1:8000"
    )
    splits: dict[str, SplitSettings] = Field(
        default_factory=lambda: {"train": SplitSettings()},
        description="Training splits: name -> {shuffle, num_samples}",
    )
    eval_split: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="Split for evaluation (null: the training splits, which the eval "
        "metrics then say: eval/eval_on_training_split = 1)",
    )
    num_rollouts: int | None = Field(
        None, ge=1, le=256, description="OpenReward's name for group_size; sets it when given"
    )
    max_failing_rollouts: int = Field(
        0, ge=0, le=255, description="Failed episodes a task group may have (runner-side)"
    )
    reward_reduction: Literal["sum", "mean", "max", "min"] = Field(
        "sum", description="How an episode's per-call rewards combine into its return"
    )
    nonterminal_reward: float = Field(
        0.0, ge=-10.0, le=10.0, description="Added to the rewards when the episode never finished"
    )
    max_turns: int = Field(10, ge=1, le=64, description="Model replies before the episode ends")
    format_penalty: float = Field(
        -0.1, ge=-1.0, le=0.0, description="Reward for a reply with a malformed or no tool call"
    )
    upload_rollouts: bool = Field(
        True, description="Upload trajectories to OpenReward (only when a key is set)"
    )
    upload_run_name: str | None = Field(
        None, max_length=128, description="Run name for uploads (default: wandb_name)"
    )

    @field_validator("base_url")
    @classmethod
    def _loopback(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if "/" in info.data.get("env_name", ""):
            raise ValueError(
                "a server at base_url names its environments without an organisation "
                "(the lower-cased class name, e.g. 'guessenv'): set env_name to that"
            )
        parsed = urlparse(value)
        try:
            parsed.port  # noqa: B018 - raises ValueError on a port out of range
        except ValueError:
            raise ValueError(f"base_url has an invalid port: {value!r}") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url must be an http(s) URL; got {value!r}")
        if not is_loopback(parsed.hostname):
            raise ValueError(
                "base_url must point at a loopback server (localhost, 127.0.0.1, ::1); "
                "hosted environments need no base_url"
            )
        return value.rstrip("/")

    @field_validator("splits")
    @classmethod
    def _some_split(cls, value: dict[str, SplitSettings]) -> dict[str, SplitSettings]:
        if not value or any(not name.strip() for name in value):
            raise ValueError('give at least one named split, e.g. {"train": {}}')
        return value

    @model_validator(mode="after")
    def _group_size(self) -> OpenRewardConfig:
        if self.num_rollouts is not None:
            if "group_size" in self.model_fields_set and self.group_size != self.num_rollouts:
                raise ValueError(
                    f"num_rollouts ({self.num_rollouts}) and group_size ({self.group_size}) "
                    "disagree: num_rollouts is OpenReward's name for group_size; set one of them"
                )
            # Bypass validate_assignment, as EnvConfig does for its derived field.
            object.__setattr__(self, "group_size", self.num_rollouts)
        if self.max_failing_rollouts and self.group_size - self.max_failing_rollouts < 2:
            raise ValueError(
                "max_failing_rollouts must leave at least 2 episodes per group "
                f"(group_size {self.group_size})"
            )
        return self


class OpenRewardEnv(BaseEnv):
    """An OpenReward environment (hosted, or on loopback), played through tool calls in text."""

    name = "openreward"
    Config = OpenRewardConfig
    config: OpenRewardConfig

    def __init__(
        self, config: OpenRewardConfig | None = None, context: EnvContext | None = None
    ) -> None:
        super().__init__(config, context)
        self._client: Any = None
        self._session: Any = None
        self._api_key: str | None = None
        self._start_episode()

    def _start_episode(self) -> None:
        self._tools: set[str] = set()
        self._answer_by_message = False
        self._opening = ""
        self._history: list[str] = []
        self._rewards: list[float] = []
        self._value = 0.0
        self._turn = 0
        self._done = False
        self._transcript: Transcript | None = None
        self._call_id = 0
        self.task_ref: tuple[str, int] | None = None  # (split, index) of the episode's task
        self._eval_on_train = False

    # Episode ------------------------------------------------------------------------------

    async def reset(self, seed: int, split: Split = "train") -> str:
        await self.close()  # a reused instance releases its previous session first
        self._start_episode()
        cfg = self.config
        self._api_key = self.context.api_keys.get(API_KEY_NAME) or None
        if "/" in cfg.env_name and cfg.base_url is None and not self._api_key:
            raise RuntimeError(
                f"OpenReward environment {cfg.env_name!r} is hosted and needs "
                "OPENREWARD_API_KEY; set it, or serve the environment locally and set base_url"
            )
        self._client = make_client(self._api_key)
        # A local server may host several environments: the variant picks one by name.
        variant = cfg.env_name if cfg.base_url is not None else None
        env = self._client.environments.get(cfg.env_name, variant=variant, base_url=cfg.base_url)
        splits = (
            {cfg.eval_split: SplitSettings()}
            if split == "eval" and cfg.eval_split is not None
            else cfg.splits
        )
        self._eval_on_train = split == "eval" and cfg.eval_split is None
        if self._eval_on_train:
            _warn_eval_on_train(cfg.env_name, list(cfg.splits))
        split_name, index = await pick_task(env, cfg.base_url, splits, seed)
        self.task_ref = (split_name, index)
        session = env.session(split=split_name, index=index)
        await session.__aenter__()
        self._session = session
        prompt = _blocks_text(await session.get_prompt())
        tools = await session.list_tools(format="openai")
        self._answer_by_message = await session.is_assistant_message_final()
        self._tools = {t["name"] for t in tools}
        preamble = toolcalls.tools_preamble(
            toolcalls.qwen_tool_specs(tools), self._answer_by_message
        )
        self._opening = f"{preamble}\n\n{prompt}"
        if self._api_key and cfg.upload_rollouts:
            from openreward import UserMessage

            self._transcript = Transcript(
                cfg.upload_run_name or cfg.wandb_name or "rl-control-server",
                cfg.env_name,
                split_name,
                index,
                [(UserMessage(self._opening), None, False)],
            )
        return self._opening

    async def step(self, action: str) -> StepResult:
        if self._session is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        self._turn += 1
        self._log_assistant(action)
        parsed = toolcalls.parse_tool_calls(action, self._tools)
        responses: list[str] = []
        metrics = {"tool_calls": 0.0, "malformed_tool_call": 0.0, "tool_error": 0.0}
        if self._eval_on_train and self._turn == 1:
            # Once per episode: evaluation scores here are not held-out scores.
            metrics["eval_on_training_split"] = 1.0
        outcomes: list[str] = []
        if parsed.empty and self._answer_by_message:
            outcomes.append(await self._call(None, action, responses, metrics))
        elif parsed.empty:
            parsed.errors.append("the reply has no <tool_call>")
        for call in parsed.calls:
            outcomes.append(await self._call(call, action, responses, metrics))
            if outcomes[-1] in ("finished", "failed"):
                break
        finished = "finished" in outcomes
        if parsed.errors:
            responses.append(_correction(parsed.errors))
        penalty = 0.0
        if (parsed.errors or "refused" in outcomes) and not finished:
            metrics["malformed_tool_call"] = 1.0
            penalty = self.config.format_penalty
        self._done = finished or "failed" in outcomes or self._turn >= self.config.max_turns
        reward = self._advance(finished) + penalty
        metrics["finished"] = float(finished)
        self._history.append(
            f"Your reply (turn {self._turn}):\n{action}\n\n" + "\n".join(responses)
        )
        return StepResult(self._observation(), reward, self._done, metrics)

    async def close(self) -> None:
        session, self._session = self._session, None
        client, self._client = self._client, None
        try:
            if session is not None:
                await session.__aexit__(None, None, None)
        finally:
            if client is not None:
                await client.environments.aclose()
            if self._transcript is not None and self._api_key:
                submit(self._api_key, self._transcript)
                self._transcript = None

    # Tool calls ---------------------------------------------------------------------------

    async def _call(
        self,
        call: toolcalls.ToolCall | None,
        action: str,
        responses: list[str],
        metrics: dict[str, float],
    ) -> str:
        """Run one call (None: the reply goes to the terminal tool). Returns "ok", "finished",
        "refused" (the server rejected the call: bad arguments) or "failed" (session gone)."""
        from openreward.api.errors import ToolCallError, ToolFailed

        try:
            if call is None:
                output = await self._session.call_terminal_tool(action)
            else:
                output = await self._session.call_tool(call.name, call.arguments)
        except ToolCallError as exc:
            metrics["tool_error"] += 1.0
            text = f"Error ({exc.reason}): {exc.detail}"
            responses.append(toolcalls.tool_response(text))
            self._log_call(call, text, None, False)
            return "refused"
        except ToolFailed as exc:  # the tool raised on the server, which ends its session
            metrics["tool_error"] += 1.0
            metrics["tool_failed"] = 1.0
            text = f"The tool failed: {exc}"
            responses.append(toolcalls.tool_response(text))
            self._log_call(call, text, None, False)
            return "failed"
        metrics["tool_calls"] += 1.0
        if output.reward is not None:
            self._rewards.append(float(output.reward))
        text = _blocks_text(output.blocks)
        responses.append(toolcalls.tool_response(text))
        self._log_call(call, text, output.reward, bool(output.finished))
        return "finished" if output.finished else "ok"

    # Rewards and observations -------------------------------------------------------------

    def _advance(self, finished: bool) -> float:
        """This step's reward: how much the reduced episode return changed (so an episode's
        rewards sum to its reduced return, whatever the reduction)."""
        rewards = list(self._rewards)
        if self._done and not finished:
            rewards.append(self.config.nonterminal_reward)
        value = _reduce(rewards, self.config.reward_reduction)
        delta, self._value = value - self._value, value
        return delta

    def _observation(self) -> str:
        if self._done:
            return self._history[-1] if self._history else ""
        return "\n\n".join([self._opening, *self._history])

    # Upload transcript --------------------------------------------------------------------

    def _log_assistant(self, action: str) -> None:
        if self._transcript is not None:
            from openreward import AssistantMessage

            self._transcript.events.append((AssistantMessage(action), None, False))

    def _log_call(
        self, call: toolcalls.ToolCall | None, result: str, reward: float | None, done: bool
    ) -> None:
        if self._transcript is None:
            return
        from openreward import ToolCall, ToolResult

        self._call_id += 1
        call_id = f"call-{self._call_id}"
        name = call.name if call is not None else "terminal"
        arguments = json.dumps(call.arguments if call is not None else {})
        self._transcript.events.append((ToolCall(name, arguments, call_id), None, False))
        self._transcript.events.append((ToolResult(result, call_id), reward, done))


def _warn_eval_on_train(env_name: str, splits: list[str]) -> None:
    if env_name in _warned_eval_on_train:
        return
    _warned_eval_on_train.add(env_name)
    log.warning(
        "OpenReward %s: no eval_split is set, so evaluation draws tasks from the training "
        "split(s) %s; eval/* metrics are not held-out scores (set eval_split to fix that)",
        env_name,
        ", ".join(splits),
    )


def _reduce(rewards: list[float], how: str) -> float:
    if not rewards:
        return 0.0
    if how == "sum":
        return sum(rewards)
    if how == "mean":
        return sum(rewards) / len(rewards)
    return max(rewards) if how == "max" else min(rewards)


def _blocks_text(blocks: Any) -> str:
    """Text of OpenReward content blocks (images are not shown to a text model)."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for block in blocks or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else "[image omitted]")
    return "\n".join(parts)


def _correction(errors: list[str]) -> str:
    return (
        f"Your reply had no usable tool call: {'; '.join(errors)}. Call a tool like this:\n"
        f"{toolcalls.EXAMPLE_CALL}"
    )
