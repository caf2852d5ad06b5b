"""The jobs an engine host answers itself (core.spec): a chat completion on a base model or a
checkpoint (/v1, vLLM's generate), and a warm-up. No environment code runs here: a test
inference scored by an environment runs in the inference client (runners/infer), which samples
from the host like a run. Samplers and tokenizers are kept between jobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from core.settings import Settings
from core.spec import ChatJob, WarmJob
from runners.backends.factory import create_service
from runners.engine.local import LocalServiceClient
from runners.engine_host.chat import ChatCompletion, Emit
from runners.episodes.policy import SamplerPolicy
from runners.episodes.render import Renderer

MAX_CACHED_SAMPLERS = 4


class ChatJobs:
    def __init__(self, settings: Settings, local: LocalServiceClient) -> None:
        self.settings = settings
        self._services: dict[str, Any] = {"local": local}
        self._samplers: dict[tuple[str, str, str | None], Any] = {}
        self._tokenizers: dict[str, Any] = {}
        self._loading = asyncio.Lock()

    async def handle(
        self,
        job: ChatJob | WarmJob,
        cancel: threading.Event | None = None,
        emit: Emit | None = None,
    ) -> dict[str, Any]:
        if isinstance(job, WarmJob):
            return await self.warm(job.model, job.backend)
        sampler = await self._sampler(job.backend, job.model, job.adapter)
        return await ChatCompletion(job, sampler, self._tokenizer(job.model)).run(cancel, emit)

    async def warm(self, model: str, backend: str) -> dict[str, Any]:
        """Load `model` and its tokenizer and sample one token, so a first request is warm."""
        started = time.monotonic()
        sampler = await self._sampler(backend, model, None)
        policy = SamplerPolicy(
            sampler, max_tokens=1, temperature=0.0, top_p=1.0, top_k=-1, stop=[], seed=0
        )
        await policy.sample(Renderer(self._tokenizer(model)).prompt_tokens("Hello"))
        return {"ok": True, "model": model, "latency_s": round(time.monotonic() - started, 3)}

    async def _sampler(self, backend: str, model: str, adapter: str | None) -> Any:
        async with self._loading:  # concurrent first requests load a model once
            key = (backend, model, adapter)
            if key not in self._samplers:
                service = self._service(backend)
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

    def _service(self, backend: str) -> Any:
        if backend not in self._services:  # hosted Tinker: a run trained there, asked on /v1
            self._services[backend] = create_service(
                backend, self.settings, self.settings.var_dir / "inference"
            )
        return self._services[backend]

    def _tokenizer(self, model: str) -> Any:
        from runners.models.loading import load_tokenizer

        if model not in self._tokenizers:
            self._tokenizers[model] = load_tokenizer(model, self.settings.models_dir)
        return self._tokenizers[model]
