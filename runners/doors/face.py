"""The inference face an Atropos or verifiers environment samples from: the run's current policy
served on a loopback port with a key made for the run (`Authorization: Bearer`), in the
runner's own event loop. SGLang's `POST /generate` (what managed_server uses), lenient OpenAI
`/v1/chat/completions` (with vLLM's `return_token_ids`, as verifiers' v0 trainers ask; tools
for templates with a tool format) and `/v1/completions`, vLLM's `POST /inference/v1/generate`
(token ids in and out, as verifiers' v1 trainers ask), `GET /v1/models` (with
`max_model_len`), `GET /health`. The runner swaps the policy after each training step;
requests already running finish on the one they started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tinker import types

from runners.doors import requests as shapes
from runners.doors.requests import BadRequest, SamplingDefaults
from runners.doors.tool_calls import knows_tools, template_messages

log = logging.getLogger(__name__)
MAX_N = 1024  # samples per request (managed_server asks for a whole group at once)
# Completions whose policy is remembered (for the staleness of the groups they end up in): far
# more than the environment keeps queued (max_batches_offpolicy batches). Each is kept as a
# hash of its tokens, a few dozen bytes.
REMEMBERED = 65_536
DRAIN_S = 60.0  # at a run's end, how long samples already running may take to finish


@dataclass
class FaceStats:
    """What the face served since the last look (the runner reports it per step, under its
    door's name: atropos/face_requests, verifiers/face_requests)."""

    door: str = "atropos"
    requests: int = 0
    sequences: int = 0
    tokens: int = 0
    refused: int = 0
    tools_unsupported: int = 0  # requests with tools the model's template cannot show it
    last_refusal: str | None = None
    first_request_at: float | None = None  # time.monotonic() of the first request served

    def take(self) -> dict[str, float]:
        out = {
            f"{self.door}/face_requests": float(self.requests),
            f"{self.door}/face_sequences": float(self.sequences),
            f"{self.door}/face_tokens": float(self.tokens),
            f"{self.door}/face_refused": float(self.refused),
            f"{self.door}/face_tools_unsupported": float(self.tools_unsupported),
        }
        self.requests = self.sequences = self.tokens = self.refused = 0
        self.tools_unsupported = 0
        return out


class InferenceFace:
    """The policy behind the endpoints, the key they ask for, and the gate that holds new
    requests while the local backend trains (both share its CPU or GPU)."""

    def __init__(
        self,
        tokenizer: Any,
        defaults: SamplingDefaults,
        context: int | None,
        end_ids: list[int],
        model_name: str,
        max_tokens_cap: int | None = None,
        door: str = "atropos",
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens_cap = max_tokens_cap
        self.defaults = defaults
        self.context = context
        self.end_ids = end_ids
        self.model_name = model_name
        self.key = secrets.token_urlsafe(24)
        self.stats = FaceStats(door)
        self._said_no_tools = False
        self._sampler: Any = None
        self.version = 0
        self.policy_step: int | None = None  # optimizer steps behind the policy served now
        self._served_by: OrderedDict[int, int] = OrderedDict()  # tokens' hash -> policy
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # The policy ----------------------------------------------------------------------------

    @property
    def sampler(self) -> Any:
        """The policy new requests sample from."""
        return self._sampler

    def set_sampler(self, sampler: Any, policy_step: int | None = None) -> None:
        self._sampler = sampler
        self.version += 1
        self.policy_step = policy_step

    def policy_of(self, tokens: list[int]) -> int | None:
        """The policy step that served a completion of exactly these tokens (the newest one,
        if several did); None when the face did not serve it (or has forgotten it)."""
        return self._served_by.get(hash(tuple(tokens)))

    async def drain(self, timeout_s: float) -> None:
        """Hold new requests and wait (at most `timeout_s`) for those being sampled: the
        backend's threads must not be mid-sample when the process exits."""
        self._open.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """New requests wait while this is held (running ones go on)."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    async def sample(self, prompt: list[int], sampling: shapes.Sampling) -> list[Any]:
        await self._open.wait()
        sampler, policy_step = self._sampler, self.policy_step
        if sampler is None:
            raise BadRequest("the policy is not loaded yet")
        self._in_flight += 1
        self._idle.clear()
        try:
            response = await asyncio.shield(
                asyncio.ensure_future(
                    sampler.sample(
                        prompt=types.ModelInput.from_ints(prompt),
                        num_samples=sampling.n,
                        sampling_params=sampling.params,
                    )
                )
            )
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        sequences = list(response.sequences)
        if policy_step is not None:
            for sequence in sequences:
                key = hash(tuple(int(t) for t in sequence.tokens))
                self._served_by[key] = policy_step
                self._served_by.move_to_end(key)
            while len(self._served_by) > REMEMBERED:
                self._served_by.popitem(last=False)
        self.stats.requests += 1
        self.stats.sequences += len(sequences)
        self.stats.tokens += sum(len(s.tokens) for s in sequences)
        if self.stats.first_request_at is None:
            self.stats.first_request_at = time.monotonic()
        return sequences

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    # Endpoints -----------------------------------------------------------------------------

    async def generate(self, body: dict[str, Any]) -> Any:
        """SGLang's /generate: `input_ids` as given (or `text`, encoded), `sampling_params`."""
        if body.get("input_ids") is not None:
            prompt = shapes.token_ids(body["input_ids"], "input_ids")
        elif isinstance(body.get("text"), str) and body["text"]:
            prompt = list(self.tokenizer.encode(body["text"]))
        else:
            raise BadRequest("input_ids: give the prompt's token ids (or text)")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params: expected an object")
        sampling = shapes.sampling_from(
            params,
            self.defaults,
            self.end_ids,
            len(prompt),
            self.context,
            "max_new_tokens",
            MAX_N,
            self.max_tokens_cap,
        )
        sequences = await self.sample(prompt, sampling)
        answer = shapes.generate_answer(sequences, len(prompt), self.decode)
        return answer[0] if sampling.n == 1 else answer

    async def vllm_generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's /inference/v1/generate: `token_ids` as given, `sampling_params`; token ids,
        a `token_id:<id>` logprob for each, and the finish reason out."""
        prompt = shapes.token_ids(body.get("token_ids"), "token_ids")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params: expected an object")
        sampling = self._openai_sampling(params, len(prompt))
        sequences = await self.sample(prompt, sampling)
        return shapes.vllm_generate_answer(sequences, prompt)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's chat completions; `tools` shown to a model whose template has a tool
        format (its calls parsed back), else left out: it answers text, and the face counts
        and logs it once."""
        tools = shapes.tool_list(body)
        with_tools = tools is not None and knows_tools(self.tokenizer)
        if tools is not None and not with_tools:
            if not self._said_no_tools:
                log.warning(
                    "a request sent tools, and %s's chat template has no tool format: it "
                    "answers text, and no tool call is parsed",
                    self.model_name,
                )
                self._said_no_tools = True
            self.stats.tools_unsupported += 1
        messages = shapes.chat_messages(body, tools=with_tools)
        extra = {"tools": tools} if with_tools else {}
        text = self.tokenizer.apply_chat_template(
            template_messages(messages) if with_tools else messages,
            tokenize=False,
            add_generation_prompt=True,
            **extra,
        )
        prompt = list(self.tokenizer.encode(text, add_special_tokens=False))
        sequences = await self.sample(prompt, self._openai_sampling(body, len(prompt)))
        return shapes.chat_answer(
            str(body.get("model") or self.model_name),
            sequences,
            len(prompt),
            self.decode,
            self.token_text,
            bool(body.get("logprobs")),
            prompt if body.get("return_token_ids") else None,
            tools=with_tools,
        )

    def _openai_sampling(self, body: dict[str, Any], prompt_length: int) -> shapes.Sampling:
        """The sampling an OpenAI-style body asks for (its `max_tokens`, `n`, `stop`, ...)."""
        return shapes.sampling_from(
            body,
            self.defaults,
            self.end_ids,
            prompt_length,
            self.context,
            "max_tokens",
            MAX_N,
            self.max_tokens_cap,
        )

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        raw = body.get("prompt")
        prompts: list[list[int]]
        if isinstance(raw, str):
            prompts = [list(self.tokenizer.encode(raw))]
        elif isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            prompts = [list(self.tokenizer.encode(p)) for p in raw]
        elif isinstance(raw, list) and raw and all(isinstance(p, int) for p in raw):
            prompts = [shapes.token_ids(raw, "prompt")]
        else:
            raise BadRequest("prompt: give a string, a list of strings, or token ids")
        groups = []
        for prompt in prompts:
            sampling = self._openai_sampling(body, len(prompt))
            groups.append((await self.sample(prompt, sampling), len(prompt)))
        return shapes.completion_answer(
            str(body.get("model") or self.model_name), groups, self.decode
        )

    def app(self) -> Starlette:
        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/generate", self._endpoint(self.generate, openai=False), methods=["POST"]),
            Route("/v1/chat/completions", self._endpoint(self.chat), methods=["POST"]),
            Route("/v1/completions", self._endpoint(self.complete), methods=["POST"]),
            Route("/inference/v1/generate", self._endpoint(self.vllm_generate), methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]
        return Starlette(routes=routes)

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "policy_version": self.version})

    async def _models(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return _refusal("a key is needed (Authorization: Bearer)", 401, openai=True)
        model: dict[str, Any] = {"id": self.model_name, "object": "model"}
        if self.context is not None:
            model["max_model_len"] = self.context  # vLLM's: verifiers checks prompts by it
        return JSONResponse({"object": "list", "data": [model]})

    def _endpoint(
        self, handler: Callable[[dict[str, Any]], Awaitable[Any]], openai: bool = True
    ) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            if not self._authorized(request):
                self.stats.refused += 1
                self.stats.last_refusal = f"{request.url.path}: no or a wrong key"
                return _refusal("a key is needed (Authorization: Bearer)", 401, openai)
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise BadRequest("expected a JSON object")
                return JSONResponse(await handler(body))
            except (BadRequest, ValueError) as exc:
                # ValueError: the backend refusing the request (a prompt beyond the context).
                self.stats.refused += 1
                self.stats.last_refusal = f"{request.url.path}: {exc}"
                log.warning("%s refused: %s", request.url.path, exc)
                return _refusal(str(exc), 400, openai)

        return endpoint

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return secrets.compare_digest(given.encode(), f"Bearer {self.key}".encode())


def _refusal(message: str, status: int, openai: bool) -> JSONResponse:
    if openai:
        body: dict[str, Any] = {"error": {"message": message, "type": "invalid_request_error"}}
    else:
        body = {"error": message}
    return JSONResponse(body, status_code=status)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The runner handles SIGTERM itself (a stop with a checkpoint), not uvicorn.
        yield


@contextlib.asynccontextmanager
async def serving(face: InferenceFace) -> AsyncIterator[str]:
    """The face on a loopback port of its own, for the duration; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        face.app(), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # it failed to start: raise why
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        sock.close()
