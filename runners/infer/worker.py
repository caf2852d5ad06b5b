"""Test inference jobs (core.spec `InferenceJob`): an environment's prompts answered and scored,
in the inference client (main.py), sampling from the engine host placed for the job's model as
a run does (or from Tinker). Environment code runs here, never in a host. Samplers and renderers
are kept between jobs. A job may carry a `deadline` (epoch seconds): sampling stops there and
the answer says which responses were cut short, so a client with its own timeout gets an
answer; a cancel event stops it the same way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from core.frameworks import FRAMEWORKS, load
from core.settings import Settings
from core.spec import InferenceJob
from environments.base import BaseEnv, EnvConfig, EnvContext, SingleTurnEnv, Unscorable
from environments.support.loader import load_env_class
from runners.backends.factory import create_service, resolve_backend
from runners.episodes.policy import Completion, SamplerPolicy
from runners.episodes.render import Renderer
from runners.episodes.rollouts import EpisodeSpec, run_episode
from runners.episodes.sources import env_context

log = logging.getLogger("infer")
MAX_CACHED_SAMPLERS = 4


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.context: EnvContext = env_context(settings)
        # By backend and model: on the local backend, a connection to the host of that model.
        self._services: dict[tuple[str, str], Any] = {}
        self._samplers: dict[tuple[str, str, str | None], Any] = {}
        self._renderers: dict[str, Renderer] = {}
        self._loading = asyncio.Lock()

    async def handle(
        self, job: InferenceJob, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        started = time.monotonic()
        inference = FRAMEWORKS[job.source.framework].inference
        if inference is not None:
            return await self.framework_job(job, started, inference)
        env_cls = load_env_class(Path(job.source.env_file), job.source.env_class)
        config = env_cls.Config.model_validate(job.source.config)
        model = job.model
        backend = resolve_backend(config.backend, self.settings)
        sampler = await self._sampler(backend, model, job.adapter)
        renderer = self._renderer(model, config)
        budget = Budget.from_job(job)
        policy = SamplerPolicy(
            sampler,
            max_tokens=job.max_tokens,
            temperature=job.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            stop=renderer.stop_token_ids(),
            seed=job.seed,
            deadline=budget.deadline if backend == "local" else None,
            cancel=cancel if backend == "local" else None,
        )
        results = await asyncio.gather(
            *(self._one(env_cls, config, renderer, policy, item, budget) for item in _items(job))
        )
        return {
            "ok": True,
            "model": model,
            "backend": backend,
            "results": results,
            "latency_s": round(time.monotonic() - started, 3),
        }

    async def framework_job(self, job: InferenceJob, started: float, path: str) -> dict[str, Any]:
        """Another framework's environment (core.frameworks: its `inference` class at `path`)
        scoring its items, or free prompts, in its own interpreter."""
        from core.model_names import context_length

        run_config = FRAMEWORKS[job.source.framework].run_config
        assert run_config is not None  # a framework with its own inference has its run config
        config = load(run_config).model_validate(job.source.config)
        backend = resolve_backend(config.backend, self.settings)
        sampler = await self._sampler(backend, job.model, job.adapter)
        tokenizer = self._renderer(job.model, EnvConfig(model_name=job.model)).tokenizer
        context = (
            context_length(job.model, self.settings.models_dir) if backend == "local" else None
        )
        inference = load(path)(self.settings, job, sampler, tokenizer, context)
        results = await inference.run(Budget.from_job(job).deadline)
        return {
            "ok": True,
            "model": job.model,
            "backend": backend,
            "results": results,
            "latency_s": round(time.monotonic() - started, 3),
        }

    async def _one(
        self,
        env_cls: type[BaseEnv],
        config: EnvConfig,
        renderer: Renderer,
        policy: SamplerPolicy,
        item: dict[str, Any],
        budget: Budget,
    ) -> dict[str, Any]:
        if issubclass(env_cls, SingleTurnEnv):
            env = env_cls(config, self.context)
            return await self._single_turn(env, renderer, policy, item, budget)
        return await self._episode(env_cls, config, renderer, policy, item, budget)

    async def _single_turn(
        self,
        env: SingleTurnEnv,
        renderer: Renderer,
        policy: SamplerPolicy,
        item: dict[str, Any],
        budget: Budget,
    ) -> dict[str, Any]:
        task = None
        prompt = item["prompt"]
        if prompt is None:
            task = env.get_task(item["seed"], "eval")
            prompt = task.prompt
        completion = await policy.complete(renderer.prompt_tokens(prompt))
        response = renderer.decode(completion.tokens)
        cut = budget.cut_short(completion, policy.max_tokens)
        result: dict[str, Any] = {
            "prompt": prompt,
            "response": response,
            "tokens": len(completion.tokens),
            "truncated": cut is not None,
        }
        reasons = [cut] if cut else []
        try:
            score = float(env.score(prompt, response, task))
            result.update(score=score, correct=score >= 1.0 - 1e-9)
        except Unscorable as exc:
            result.update(score=None, correct=None)
            reasons.append(f"cannot score this prompt: {exc}")
        except Exception as exc:  # a verifier bug is reported per prompt, not as a failure
            result.update(score=None, correct=None)
            reasons.append(f"the verifier failed: {type(exc).__name__}: {exc}")
        result["reason"] = "; ".join(reasons) or None
        return result

    async def _episode(
        self,
        env_cls: type[BaseEnv],
        config: EnvConfig,
        renderer: Renderer,
        policy: SamplerPolicy,
        item: dict[str, Any],
        budget: Budget,
    ) -> dict[str, Any]:
        """A multi-turn environment plays a whole episode; a free prompt steers it as the
        system prompt."""
        steering = Renderer(
            renderer.tokenizer, renderer.template, item["prompt"] or renderer.system_prompt
        )
        spec = EpisodeSpec(
            group=0, seed=item["seed"], make_env=lambda: env_cls(config, self.context)
        )
        episode = await run_episode(
            spec, policy, steering.prompt_tokens, steering.decode, split="eval"
        )
        turns = []
        observation = None
        for t in episode.transitions:
            turns.append({"action": steering.decode(t.action_tokens), "reward": t.reward})
        if episode.transitions:
            observation = steering.decode(episode.transitions[0].prompt_tokens)
        cut = budget.episode_cut_short()
        return {
            "prompt": item["prompt"] or observation,
            "response": turns[-1]["action"] if turns else "",
            "score": episode.total_reward,
            "correct": episode.correct,
            "reason": cut,
            "truncated": cut is not None,
            "tokens": sum(len(t.action_tokens) for t in episode.transitions),
            "turns": turns,
        }

    async def _sampler(self, backend: str, model: str, adapter: str | None) -> Any:
        async with self._loading:  # concurrent first requests load a model once
            return await self._sampler_now(backend, model, adapter)

    async def _sampler_now(self, backend: str, model: str, adapter: str | None) -> Any:
        key = (backend, model, adapter)
        self._lost(backend, model)
        if key not in self._samplers:
            service = await asyncio.to_thread(self._service, backend, model)
            if adapter:
                sampler = await service.create_sampling_client(model_path=adapter)
            else:
                sampler = await service.create_sampling_client(base_model=model)
            if len(self._samplers) >= MAX_CACHED_SAMPLERS:
                evicted = self._samplers.pop(next(iter(self._samplers)))
                close = getattr(evicted, "close", None)
                if close is not None:  # its model (the base) is freed with its last user
                    close()  # requests it already has still finish
            self._samplers[key] = sampler
        return self._samplers[key]

    def _service(self, backend: str, model: str) -> Any:
        """The backend's service for `model`: on the local backend, a connection to the engine
        host placed for it (connecting may start the host: keep it off the event loop)."""
        if (backend, model) not in self._services:
            self._services[(backend, model)] = create_service(
                backend,
                self.settings,
                self.settings.var_dir / "inference",
                engine="shared",
                client="inference",
                base_model=model,
                role="inference",
            )
        return self._services[(backend, model)]

    def _lost(self, backend: str, model: str) -> bool:
        """Whether the host of `model`'s service went (then it and its samplers are forgotten:
        the next job connects again)."""
        service = self._services.get((backend, model))
        if service is None or not getattr(service, "lost", False):
            return False
        del self._services[(backend, model)]
        for key in [k for k in self._samplers if k[:2] == (backend, model)]:
            del self._samplers[key]
        return True

    def _renderer(self, model: str, config: EnvConfig) -> Renderer:
        from runners.models.loading import load_tokenizer

        if model not in self._renderers:
            self._renderers[model] = Renderer(load_tokenizer(model, self.settings.models_dir))
        base = self._renderers[model]
        return Renderer(base.tokenizer, config.prompt_template, config.system_prompt)


def _items(job: InferenceJob) -> list[dict[str, Any]]:
    """The prompts to answer: the request's own, or `num_items` tasks drawn from the env."""
    if job.prompts:
        return [{"prompt": p, "seed": i} for i, p in enumerate(job.prompts)]
    base = job.seed or 0
    return [{"prompt": None, "seed": base + i} for i in range(job.num_items or 0)]


class Budget:
    """A request's time budget: when local sampling must stop, and how to say it did."""

    def __init__(self, deadline: float | None, budget_s: float | None) -> None:
        self.deadline = deadline  # time.monotonic()
        self.budget_s = budget_s

    @classmethod
    def from_job(cls, job: InferenceJob) -> Budget:
        if job.deadline is None:
            return cls(None, None)
        # The server stamps wall-clock time; the engine compares monotonic time.
        return cls(time.monotonic() + (job.deadline - time.time()), job.budget_s)

    def ran_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def cut_short(self, completion: Completion, max_tokens: int) -> str | None:
        """Why a completion ended before its stop token and its max_tokens, if it did."""
        n = len(completion.tokens)
        if completion.stop_reason != "length" or n >= max_tokens:
            return None
        if self.ran_out():
            return (
                f"cut short after {n} of {max_tokens} tokens: the time budget of this request "
                f"({self.budget_s:g} s, RLCS_INFERENCE_BUDGET_S) ran out; ask for fewer prompts "
                "or a smaller max_tokens for complete answers"
            )
        return f"cut short after {n} of {max_tokens} tokens: the model's context is full"

    def episode_cut_short(self) -> str | None:
        if not self.ran_out():
            return None
        return (
            f"the time budget of this request ({self.budget_s:g} s, RLCS_INFERENCE_BUDGET_S) "
            "ran out during the episode: later turns were cut short"
        )
