"""Test inference's free prompts on an environment of another framework (Atropos, verifiers):
the model answers each through its chat template, unscored (such an environment scores only
the items it makes itself), saying so."""

from __future__ import annotations

import asyncio
from typing import Any

from core.spec import InferenceJob
from runners.episodes.policy import SamplerPolicy
from runners.episodes.render import Renderer


async def answer_prompts(
    job: InferenceJob, sampler: Any, tokenizer: Any, top_p: float, top_k: int, reason: str
) -> list[dict[str, Any]]:
    """Each of the job's prompts answered at once, unscored, saying `reason`."""
    prompts = job.prompts or []
    return list(
        await asyncio.gather(
            *(
                _answer(job, sampler, tokenizer, p, i, top_p, top_k, reason)
                for i, p in enumerate(prompts)
            )
        )
    )


async def _answer(
    job: InferenceJob,
    sampler: Any,
    tokenizer: Any,
    prompt: str,
    index: int,
    top_p: float,
    top_k: int,
    reason: str,
) -> dict[str, Any]:
    renderer = Renderer(tokenizer)
    policy = SamplerPolicy(
        sampler,
        max_tokens=job.max_tokens,
        temperature=job.temperature,
        top_p=top_p,
        top_k=top_k,
        stop=Renderer(tokenizer, "plain").stop_token_ids(),
        seed=None if job.seed is None else job.seed + index,
    )
    completion = await policy.complete(renderer.prompt_tokens(prompt))
    return {
        "prompt": prompt,
        "response": renderer.decode(completion.tokens),
        "score": None,
        "correct": None,
        "reason": reason,
        "truncated": False,
        "tokens": len(completion.tokens),
    }
