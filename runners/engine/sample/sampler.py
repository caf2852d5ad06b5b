"""The local sampling client: checks a sample() call and hands it to the model's engine.

Settings follow tinker's SamplingParams; logprobs are those of the raw model distribution.
With `record_stability_info`, every sampled sequence is recorded for stable_reinforce.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import random
import threading
from collections.abc import Callable, Sequence
from functools import partial
from itertools import count
from typing import Any

import numpy as np
from tinker import types

from runners.engine import heap
from runners.engine.futures import LocalFuture
from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.recorded_sequences import RecordedSequence, SequenceStore
from runners.engine.sample import prompt_scores
from runners.engine.sample.batch import Row
from runners.engine.sample.prompt_scores import PromptScoring
from runners.engine.sample.scheduler import SampleRequest, adapter_closed, scheduler_for

# Used when SamplingParams.max_tokens is None (tinker advises always setting it).
DEFAULT_MAX_TOKENS = 1024
_client_ids = count(1)


def eos_ids(host: ModelHost) -> set[int]:
    ids: set[int] = set()
    for value in (
        getattr(host.tokenizer, "eos_token_id", None),
        getattr(getattr(host.model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids


def _stops(stop: Any, eos: set[int]) -> tuple[frozenset[int], tuple[str, ...]]:
    """Stop ids and strings; EOS stops too unless `stop` is an empty list (as in tinker).

    A stop token is kept as the last sampled token. A stop string ends sampling after the
    token that completes it; that token is kept (tokens are what training uses), so the
    decoded text still holds the string.
    """
    if stop is None:
        return frozenset(eos), ()
    if isinstance(stop, str):
        return frozenset(eos), (stop,)
    stop = list(stop)
    if not stop:
        return frozenset(), ()
    if all(isinstance(s, str) for s in stop):
        if any(s == "" for s in stop):
            raise ValueError("stop strings must not be empty")
        return frozenset(eos), tuple(stop)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        return frozenset(eos) | frozenset(stop), ()
    raise ValueError("SamplingParams.stop must be a string, a list of strings or a list of ints")


def _row_seed(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _prompt_tokens(prompt: types.ModelInput, vocab: int) -> list[int]:
    try:
        tokens = prompt.to_ints()
    except Exception as exc:
        raise ValueError(f"the local backend samples from token prompts only ({exc})") from exc
    if not tokens:
        raise ValueError("the prompt is empty: give at least one token")
    if min(tokens) < 0 or max(tokens) >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab})")
    return tokens


class LocalSamplingClient:
    """Samples from a frozen snapshot of the weights (or from the base model alone)."""

    def __init__(
        self,
        host: ModelHost,
        adapter: AdapterWeights | None,
        *,
        model_path: str | None = None,
        release: Callable[[], None] | None = None,
        record_stability_info: bool = False,
        sequences: SequenceStore | None = None,
        client: str | None = None,
    ) -> None:
        """`client`: who samples through it (a trainer's model id, a session), for the fair
        turns the decode scheduler takes between clients; by default the sampler itself."""
        if record_stability_info and sequences is None:
            raise ValueError("record_stability_info needs a SequenceStore to record into")
        self._host = host
        self._adapter = adapter
        self.model_path = model_path
        # Where sampled sequences are recorded (stable_reinforce reads them); None: nowhere.
        # A call may ask for recording itself (the Tinker API's per-request flag).
        self._sequences = sequences
        self._recording = sequences if record_stability_info else None
        self._release = release  # gives back the host this sampler holds (close)
        self._closed = False
        self._tag = f"local{next(_client_ids)}"
        self._client = client or self._tag
        self._vocab = int(host.model.get_output_embeddings().weight.shape[0])
        self._eos = eos_ids(host)

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: Any = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
        *,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
        on_token: Callable[[int, int, float], None] | None = None,
        sequence_ids: Sequence[str] | None = None,
        record_stability_info: bool | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        client: str | None = None,
    ) -> LocalFuture[types.SampleResponse]:
        """tinker's sample(), plus local extensions: `deadline` (a time.monotonic() value)
        after which every sequence stops where it is, with stop_reason "length", `cancel`,
        an event that does the same at the next decode step once set, `on_token`, called
        with (sample index, token, logprob) on the scheduler's thread as each token is picked,
        `sequence_ids`, the samples' ids when the caller fixed them at submission (the Tinker
        API does; by default each gets a new one), `record_stability_info`, which records this
        call's sequences (True) or not (False) whatever the client was made with (None: as made;
        the SDK sends the flag with each request), and vLLM's `min_tokens` (no stop id can be
        drawn, and no stop ends a sequence, before that many tokens), `ignore_eos`
        (end-of-sequence ids are not stops) and `client`, who asks, when it is not the
        client the sampler was made for (the Tinker API's session: turns are fair between
        clients)."""
        if topk_sample_logprobs:
            raise ValueError(
                "topk_sample_logprobs is not served: the local backend's decode step keeps the "
                "chosen token's logprob only (top-k prompt logprobs are served: "
                "topk_prompt_logprobs)"
            )
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        if sequence_ids is not None:
            sequence_ids = list(sequence_ids)
            if len(sequence_ids) != num_samples or len(set(sequence_ids)) != num_samples:
                raise ValueError(
                    f"sequence_ids: give {num_samples} distinct ids, one per sample; "
                    f"got {len(sequence_ids)}"
                )
            if not all(isinstance(i, str) and i for i in sequence_ids):
                raise ValueError("sequence_ids must be non-empty strings")
        asked = None
        if topk_prompt_logprobs or target_prompt_logprobs is not None or prompt_alt_tokens_k:
            if sampling_params.seed is None:  # one seed for the samples and the prompt's draws
                seed = random.SystemRandom().randrange(2**62)
                sampling_params = sampling_params.model_copy(update={"seed": seed})
            asked = prompt_scores.scoring(
                len(_prompt_tokens(prompt, self._vocab)),
                self._vocab,
                topk=topk_prompt_logprobs,
                targets=target_prompt_logprobs,
                alt_k=prompt_alt_tokens_k,
                temperature=float(sampling_params.temperature),
                seed=_row_seed(sampling_params.seed or 0, -1),
            )
        wants_prompt_lp = include_prompt_logprobs or prompt_logprobs_last_n is not None
        store = self._recording
        if record_stability_info is not None:
            if record_stability_info and self._sequences is None:
                raise ValueError("record_stability_info needs a SequenceStore to record into")
            store = self._sequences if record_stability_info else None
        return self._submit(
            prompt,
            num_samples,
            sampling_params,
            (prompt_logprobs_last_n or 0) if wants_prompt_lp else -1,
            deadline,
            cancel,
            on_token,
            sequence_ids,
            store,
            asked,
            min_tokens,
            ignore_eos,
            client,
        )

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> LocalFuture[list[float | None]]:
        """Logprobs of each prompt token given the ones before it (None for the first)."""
        inner = self._submit(
            prompt, 0, types.SamplingParams(max_tokens=1), prompt_logprobs_last_n or 0
        )
        outer: LocalFuture[list[float | None]] = LocalFuture()

        def relay(done: concurrent.futures.Future[types.SampleResponse]) -> None:
            if done.exception() is not None:
                outer.set_exception(done.exception())
                return
            logprobs = done.result().prompt_logprobs
            if logprobs is None:  # asked for above; tinker's client assumes the same
                outer.set_exception(RuntimeError("the sampler answered without prompt logprobs"))
            else:
                outer.set_result(logprobs)

        inner.add_done_callback(relay)
        return outer

    def _submit(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        params: types.SamplingParams,
        prompt_lp: int,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
        on_token: Callable[[int, int, float], None] | None = None,
        sequence_ids: list[str] | None = None,
        store: SequenceStore | None = None,
        scoring: PromptScoring | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        client: str | None = None,
    ) -> LocalFuture[types.SampleResponse]:
        if self._closed:
            raise RuntimeError("this sampling client is closed")
        tokens = _prompt_tokens(prompt, self._vocab)
        limit = self._host.max_positions
        if limit is not None and len(tokens) >= limit:
            raise ValueError(
                f"the prompt has {len(tokens)} tokens; this model's context is {limit}"
            )
        max_tokens = DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if params.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {params.top_p}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
            raise ValueError(f"min_tokens must be a non-negative integer, got {min_tokens!r}")
        if min_tokens > max_tokens:
            raise ValueError(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
        stop_ids, stop_strings = _stops(params.stop, set() if ignore_eos else self._eos)
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**62)
        rows = []
        for index in range(num_samples):
            rows.append(
                Row(
                    prompt=tokens,
                    max_tokens=max_tokens,
                    temperature=float(params.temperature),
                    top_k=int(params.top_k),
                    top_p=float(params.top_p),
                    stop_ids=stop_ids,
                    stop_strings=stop_strings,
                    seed=_row_seed(seed, index),
                    min_tokens=min_tokens,
                    deadline=deadline,
                    cancel=cancel,
                    on_token=partial(on_token, index) if on_token is not None else None,
                )
            )
        future: LocalFuture[types.SampleResponse] = LocalFuture()
        request = SampleRequest(
            self._adapter,
            tokens,
            rows,
            prompt_lp,
            self._tag,
            future,
            sequence_ids=sequence_ids,
            record=self._recorder(store, tokens) if store is not None and rows else None,
            scoring=scoring,
            client=client or self._client,
        )
        scheduler_for(self._host).submit(request)
        return future

    @staticmethod
    def _recorder(
        store: SequenceStore, prompt: list[int]
    ) -> Callable[[types.SampleResponse], None]:
        """Records a response's sequences under their ids (run on the scheduler's thread)."""
        shared_prompt = np.asarray(prompt, dtype=np.int32)  # one copy for all the samples

        def record(response: types.SampleResponse) -> None:
            for sequence in response.sequences:
                tokens = np.asarray(sequence.tokens_np, dtype=np.int32)
                logprobs = np.asarray(sequence.logprobs_np, dtype=np.float32)
                store.record(
                    sequence.sequence_id, RecordedSequence(shared_prompt, tokens, logprobs)
                )

        return record

    @property
    def record_stability_info(self) -> bool:
        return self._recording is not None

    def get_tokenizer(self) -> Any:
        return self._host.tokenizer

    def get_base_model(self) -> str:
        return self._host.base_model

    def close(self) -> None:
        """Stop using the host (requests already submitted still finish): its last user's
        close frees it. The adapter goes too, from this sampler (its caller may keep it a
        while) and from the slot it holds in the sampling copy. A closed sampler samples no
        more."""
        self._closed = True
        if self._adapter is not None:
            adapter_closed(self._host, self._adapter.id)
            self._adapter = None
        release, self._release = self._release, None
        if release is not None:
            release()
            heap.give_back_free_memory()

    def sampling_stats(self) -> dict[str, int]:
        """Batches decoded and sequences sampled by this model's scheduler so far."""
        scheduler = scheduler_for(self._host)
        return {"batches": scheduler.batches, "sequences": scheduler.sequences}
