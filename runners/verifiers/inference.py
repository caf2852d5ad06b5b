"""Test inference on a verifiers environment (POST /test/inference), in the engine host.

`num_items`: the environment plays its own examples (its eval split, else its train split, in
order), one rollout each, against a short-lived inference face serving the base model or a
run's checkpoint, and scores them with its rubric; what it scored within the request's time
budget is the answer. Free `prompts` are answered through the chat template, unscored.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

from core.settings import Settings
from core.spec import InferenceJob
from core.verifiers import VerifiersRunConfig
from core.verifiers_wire import Group, Rollout
from runners.doors.face import InferenceFace, serving
from runners.doors.free_prompts import answer_prompts
from runners.doors.requests import SamplingDefaults
from runners.episodes.render import Renderer
from runners.verifiers.driver import (
    Driver,
    DriverConfig,
    EnvironmentFailed,
    sampling_args,
)

UNSCORED = (
    "a verifiers environment scores its own examples (its rubric checks their answers); ask "
    "for num_items to have it play and score them"
)


class VerifiersInference:
    def __init__(
        self,
        settings: Settings,
        job: InferenceJob,
        sampler: Any,
        tokenizer: Any,
        context: int | None,
    ) -> None:
        self.settings = settings
        self.job = job
        self.config = VerifiersRunConfig.model_validate(job.source.config)
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.context = context

    async def run(self, deadline: float | None) -> list[dict[str, Any]]:
        """`deadline`: time.monotonic() by which the answer is due."""
        if deadline is None:
            deadline = time.monotonic() + self.settings.inference_timeout_s
        cfg = self.config
        if self.job.prompts:
            return await answer_prompts(
                self.job, self.sampler, self.tokenizer, cfg.top_p, cfg.top_k, UNSCORED
            )
        return await self._own_examples(deadline)

    async def _own_examples(self, deadline: float) -> list[dict[str, Any]]:
        job, cfg = self.job, self.config
        face = InferenceFace(
            self.tokenizer,
            SamplingDefaults(job.max_tokens, job.temperature, cfg.top_p, cfg.top_k),
            self.context,
            Renderer(self.tokenizer, "plain").stop_token_ids(),
            job.model,
            max_tokens_cap=job.max_tokens,
            door="verifiers",
        )
        face.set_sampler(self.sampler)
        work = self.settings.var_dir / "inference" / "verifiers" / uuid.uuid4().hex[:12]
        sampling = sampling_args(job.max_tokens, job.temperature, cfg.top_p, cfg.top_k)
        try:
            async with serving(face) as url:
                driver = Driver.start(
                    self.settings,
                    DriverConfig.of(
                        job.source,
                        cfg.env_args(),
                        f"{url}/v1",
                        job.model,
                        cfg.seed,
                        self.settings.models_dir,
                    ),
                    work,
                    face.key,
                )
                try:
                    played = await _play(driver, job.num_items or 1, sampling, deadline)
                finally:
                    await asyncio.to_thread(driver.stop)
                    await face.drain(5.0)
        except EnvironmentFailed as exc:
            return [_nothing(str(exc))]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return _results(played, job.budget_s)


@dataclass
class Played:
    """What the environment scored in time (`groups`), what failed, and whether the time
    budget cut it short."""

    groups: list[Group]
    failed: list[BaseException]
    cut: bool


async def _play(driver: Driver, count: int, sampling: dict[str, Any], deadline: float) -> Played:
    """`count` examples of the eval split, one rollout each, until they end or `deadline`
    does (those still playing then are cancelled)."""
    await driver.wait_ready(max(0.1, deadline - time.monotonic()))
    rolls = [asyncio.ensure_future(driver.roll(i, 1, sampling, split="eval")) for i in range(count)]
    done, pending = await asyncio.wait(rolls, timeout=max(0.1, deadline - time.monotonic()))
    for roll in pending:
        roll.cancel()
    groups = [r.result() for r in rolls if r in done and not r.exception()]
    failed = [e for r in rolls if r in done and (e := r.exception()) is not None]
    return Played(groups, failed, cut=bool(pending))


def _results(played: Played, budget_s: float | None) -> list[dict[str, Any]]:
    """One result per scored rollout; a cut request's say why, a failed one's say what failed."""
    results = [_result(r) for g in played.groups for r in g.rollouts]
    if played.cut:
        cut = (
            f"the time budget of this request ({budget_s or 0:g} s, "
            "RLCS_INFERENCE_BUDGET_S) ran out before the environment scored every example"
        )
        results = [{**r, "reason": r["reason"] or cut} for r in results] or [_nothing(cut)]
    if played.failed and not results:
        results = [_nothing(str(played.failed[0]))]
    return results


def _result(rollout: Rollout) -> dict[str, Any]:
    turns = [
        {"role": str(m.get("role")), "content": str(m.get("content"))}
        for m in _listed(rollout.prompt) + _listed(rollout.completion)
    ]
    asked = [t["content"] for t in _listed(rollout.prompt) if t.get("role") == "user"]
    answers = [t["content"] for t in _listed(rollout.completion) if t.get("role") == "assistant"]
    return {
        "prompt": asked[-1] if asked else None,
        "response": answers[-1] if answers else "",
        "score": rollout.reward,
        "correct": rollout.reward >= 1.0 - 1e-9,
        "reason": rollout.error,
        "truncated": rollout.truncated,
        "tokens": rollout.sampled_tokens(),
        "turns": turns,
        "metrics": dict(rollout.metrics),
    }


def _listed(messages: list[dict[str, Any]] | str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else messages


def _nothing(reason: str) -> dict[str, Any]:
    return {
        "prompt": None,
        "response": "",
        "score": None,
        "correct": None,
        "reason": reason,
        "truncated": False,
        "tokens": 0,
    }
