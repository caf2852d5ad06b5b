"""The OpenReward adapter against a real SDK server on loopback: tool calls, rewards, uploads."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request

from environments.base import EnvContext, StepResult
from environments.openreward_env import API_KEY_NAME, OpenRewardConfig, OpenRewardEnv
from environments.support import openreward_upload
from tests.support.helpers import wait_for
from tests.support.loopback_openreward import MAX_NUMBER, free_port

HINT = re.compile(r"The number is (higher|lower) than (\d+)")


def call(guess: object) -> str:
    arguments = json.dumps({"guess": guess})
    return f'Let me try.\n<tool_call>\n{{"name": "guess", "arguments": {arguments}}}\n</tool_call>'


async def play(
    config: OpenRewardConfig, scripted: list[str], seed: int = 2, api_key: str | None = None
) -> list[StepResult]:
    """Send the scripted replies, then binary-search until the episode ends."""
    env = OpenRewardEnv(config, EnvContext(api_keys={API_KEY_NAME: api_key} if api_key else {}))
    results: list[StepResult] = []
    try:
        first = await env.reset(seed)
        assert "<tools>" in first and '"name": "guess"' in first and "<tool_call>" in first
        for reply in scripted:
            results.append(await env.step(reply))
            if results[-1].done:
                return results
        low, high = 1, MAX_NUMBER
        while not results or not results[-1].done:
            guess = (low + high) // 2
            results.append(await env.step(call(guess)))
            hints = HINT.findall(results[-1].observation)
            if hints:
                low, high = (guess + 1, high) if hints[-1][0] == "higher" else (low, guess - 1)
        return results
    finally:
        await env.close()


def test_episode_with_malformed_calls_ends_with_the_right_reward(openreward_url: str) -> None:
    config = OpenRewardConfig(env_name="guessenv", base_url=openreward_url)
    scripted = [
        '<tool_call>{"name": "guess", "arguments": {"guess": 3</tool_call>',  # bad JSON
        '<tool_call>{"name": "shout", "arguments": {}}</tool_call>',  # unknown tool
        "I think the answer is 4.",  # no tool call at all
        call("four"),  # the server refuses the arguments
    ]
    results = asyncio.run(play(config, scripted))
    for result in results[:4]:
        assert result.reward == pytest.approx(-0.1) and not result.done
        assert result.metrics["malformed_tool_call"] == 1.0
    assert "not valid JSON" in results[0].observation
    assert "no tool 'shout'" in results[1].observation
    assert "has no <tool_call>" in results[2].observation
    assert "input_validation" in results[3].observation and results[3].metrics["tool_error"]
    assert "<tool_response>" in results[4].observation  # results come back tagged
    assert results[-1].done and results[-1].reward == 1.0 and results[-1].metrics["finished"]
    assert sum(r.reward for r in results) == pytest.approx(1.0 - 0.4)
    assert all(r.metrics["malformed_tool_call"] == 0.0 for r in results[4:])


def test_a_plain_reply_goes_to_the_terminal_tool(openreward_url: str) -> None:
    config = OpenRewardConfig(env_name="quizenv", base_url=openreward_url)

    async def episode() -> tuple[str, list[StepResult]]:
        env = OpenRewardEnv(config)
        try:
            first = await env.reset(0)
            hint = await env.step('<tool_call>{"name": "hint", "arguments": {}}</tool_call>')
            return first, [hint, await env.step("42")]
        finally:
            await env.close()

    first, (hint, answer) = asyncio.run(episode())
    assert '"name": "hint"' in first and '"name": "answer"' not in first  # terminal is hidden
    assert "reply without a tool call" in first
    assert "between 40 and 45" in hint.observation and not hint.done
    assert answer.done and answer.reward == 1.0 and answer.metrics["malformed_tool_call"] == 0.0


def test_turn_limit_adds_the_nonterminal_reward(openreward_url: str) -> None:
    config = OpenRewardConfig(
        env_name="guessenv", base_url=openreward_url, max_turns=2, nonterminal_reward=-0.5
    )
    results = asyncio.run(play(config, [call(0), call(0)]))
    assert len(results) == 2 and results[-1].done and not results[-1].metrics["finished"]
    assert sum(r.reward for r in results) == pytest.approx(-0.5)


@pytest.mark.parametrize(("reduction", "expected"), [("mean", None), ("max", 1.0), ("min", 0.0)])
def test_reward_reduction(openreward_url: str, reduction: str, expected: float | None) -> None:
    config = OpenRewardConfig(
        env_name="guessenv", base_url=openreward_url, reward_reduction=reduction
    )
    results = asyncio.run(play(config, []))
    if expected is None:  # one reward per call: 0 for each miss, 1 for the hit
        expected = 1.0 / len(results)
    assert sum(r.reward for r in results) == pytest.approx(expected)


def test_eval_split_and_task_choice(openreward_url: str) -> None:
    config = OpenRewardConfig(
        env_name="guessenv",
        base_url=openreward_url,
        splits={"train": {"shuffle": True, "num_samples": 2}},
        eval_split="test",
    )

    async def task_of(seed: int, split: str) -> tuple[str, int] | None:
        env = OpenRewardEnv(config)
        try:
            await env.reset(seed, split)  # type: ignore[arg-type]
            return env.task_ref
        finally:
            await env.close()

    train = [asyncio.run(task_of(seed, "train")) for seed in range(4)]
    assert {split for split, _ in train} == {"train"}
    assert len({index for _, index in train}) == 2  # num_samples keeps a fixed subset of 2
    assert asyncio.run(task_of(1, "eval")) == ("test", 1)


def test_eval_without_an_eval_split_says_it_reuses_training_tasks(
    openreward_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = OpenRewardConfig(env_name="guessenv", base_url=openreward_url)

    async def first_step(split: str) -> StepResult:
        env = OpenRewardEnv(config)
        try:
            await env.reset(0, split)  # type: ignore[arg-type]
            return await env.step(call(1))
        finally:
            await env.close()

    with caplog.at_level("WARNING"):
        evaluated = asyncio.run(first_step("eval"))
    assert evaluated.metrics["eval_on_training_split"] == 1.0  # becomes eval/...
    assert "no eval_split is set" in caplog.text and "not held-out" in caplog.text
    assert "eval_on_training_split" not in asyncio.run(first_step("train")).metrics


def test_hosted_environment_without_a_key_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    monkeypatch.delenv("RLCS_OPENREWARD_API_KEY", raising=False)
    env = OpenRewardEnv(OpenRewardConfig(env_name="GeneralReasoning/WhoDunIt"))
    with pytest.raises(RuntimeError, match="needs OPENREWARD_API_KEY"):
        asyncio.run(env.reset(0))
    asyncio.run(env.close())


@pytest.fixture
def upload_stub() -> Iterator[tuple[str, list[dict]]]:
    """A stand-in for OpenReward's upload API (POST /v1/rollouts) that records the batches."""
    received: list[dict] = []
    app = FastAPI()

    @app.post("/v1/rollouts")
    async def rollouts(request: Request) -> dict:
        received.append({"key": request.headers.get("x-api-key"), **(await request.json())})
        return {}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20)
    yield f"http://127.0.0.1:{port}", received
    server.should_exit = True
    thread.join(timeout=10)


def test_trajectories_are_uploaded_when_a_key_is_set(
    openreward_url: str, upload_stub: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api_url, received = upload_stub
    monkeypatch.setenv("OPENREWARD_API_URL", api_url)
    config = OpenRewardConfig(
        env_name="guessenv", base_url=openreward_url, upload_run_name="adapter-test"
    )
    # The key comes from the run's settings through the EnvContext, not the environment.
    results = asyncio.run(play(config, ["no call here"], api_key="test-key"))
    assert openreward_upload.wait_idle(20)

    def events() -> list[dict]:
        return [e for batch in received for e in batch.get("events", [])]

    wait_for(lambda: any(e.get("isFinished") for e in events()), 30, every=0.1)
    assert {batch["key"] for batch in received} == {"test-key"}
    kinds = [e.get("type") for e in events()]
    assert "user_message" in kinds and "tool_call" in kinds and "tool_result" in kinds
    rewarded = [e["reward"] for e in events() if e.get("reward") is not None]
    assert rewarded[-1] == 1.0 and len(results) >= 2


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="loopback"):
        OpenRewardConfig(env_name="guessenv", base_url="http://example.com:8000")
    with pytest.raises(ValueError, match="http"):
        OpenRewardConfig(env_name="guessenv", base_url="file:///etc/passwd")
    with pytest.raises(ValueError, match="without an organisation"):
        OpenRewardConfig(env_name="Org/Name", base_url="http://127.0.0.1:8000")
    assert OpenRewardConfig(num_rollouts=6).group_size == 6
    with pytest.raises(ValueError, match="disagree"):
        OpenRewardConfig(num_rollouts=6, group_size=4)
    with pytest.raises(ValueError, match="at least 2"):
        OpenRewardConfig(group_size=4, max_failing_rollouts=3)
    with pytest.raises(ValueError, match="named split"):
        OpenRewardConfig(splits={})
    with pytest.raises(ValueError):
        OpenRewardConfig(env_name="../etc")
    frozen = OpenRewardConfig(num_rollouts=6).model_dump(mode="json")
    assert OpenRewardConfig.model_validate(frozen).group_size == 6  # as the runner reloads it
