"""The decode scheduler behind sampling clients: one thread per model, continuous batching.

Requests that share a weights snapshot decode as one running batch: a request that arrives
while the batch decodes joins it at the next step (its prefill done alongside), and each
request is answered the step its last row finishes. Requests for another snapshot wait until
the running batch drains (a forward pass runs under one set of weights).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import torch
from tinker import types

from runners.engine import prompt_scores
from runners.engine.batch import DecodeBatch, Row
from runners.engine.dynamic_batch import DynamicCacheBatch
from runners.engine.futures import LocalFuture
from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.packed_model import PackedModel, packable
from runners.engine.prompt_scores import PromptScoring
from runners.engine.sampling_model import SamplingModel, resolve_sampling_dtype
from runners.engine.slot_batch import SlotBatch
from runners.engine.slot_batch import supports as supports_slots

_STOP = object()
_sequence_ids = count(1)


@dataclass
class SampleRequest:
    """One sample() call: its rows (one per sample) and the future to complete."""

    adapter: AdapterWeights | None
    prompt: list[int]
    rows: list[Row]
    prompt_logprobs_last_n: int  # -1: none wanted, 0: all of them, n: the last n
    tag: str
    future: LocalFuture
    sequence_ids: list[str] | None = None  # one per row; None: made up here
    # Called with the response before the caller sees it (recorded sequences: a datum may
    # name them as soon as the future resolves).
    record: Callable[[types.SampleResponse], None] | None = None
    # Top-k, target logprobs and alternative draws at the prompt's positions (prompt_scores).
    scoring: PromptScoring | None = None


def _settle(future: LocalFuture, value: Any = None, error: BaseException | None = None) -> None:
    """Complete a future unless it is already done (a caller may have cancelled it)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


_schedulers: weakref.WeakKeyDictionary[ModelHost, DecodeScheduler] = weakref.WeakKeyDictionary()
_schedulers_lock = threading.Lock()


def scheduler_for(host: ModelHost) -> DecodeScheduler:
    """The host's one decode scheduler, started on first use and closed with the host."""
    with _schedulers_lock:
        scheduler = _schedulers.get(host)
        if scheduler is None or scheduler.closed:
            scheduler = DecodeScheduler(
                host,
                max_batch_sequences=host.max_batch_sequences,
                batch_window_s=host.batch_window_s,
            )
            _schedulers[host] = scheduler
            host.on_close(scheduler.close)
        return scheduler


def slots_wanted(device: torch.device) -> bool:
    """Slot batches for a transformers module where captured steps pay (CUDA); tests turn
    them on for the CPU too. A packed model always decodes in slot batches."""
    return device.type == "cuda"


def packing_wanted(host: ModelHost) -> bool:
    """The packed sampling model wherever the architecture allows (tests may turn it off to
    exercise the transformers path)."""
    return packable(host) is None


def sampling_model(host: ModelHost, dtype: torch.dtype) -> SamplingModel | PackedModel:
    """The sampler's copy of the host's model: packed when it can be, else plain modules."""
    if packing_wanted(host):
        return PackedModel(host, dtype)
    return SamplingModel(host, dtype)


class DecodeScheduler:
    """A daemon thread that batches sample requests for one ModelHost."""

    def __init__(
        self, host: ModelHost, *, max_batch_sequences: int = 64, batch_window_s: float = 0.005
    ) -> None:
        self.host = host
        self.max_batch_sequences = max(1, max_batch_sequences)
        self.batch_window_s = batch_window_s
        self.batches = 0
        self.sequences = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._backlog: deque[SampleRequest] = deque()
        self._closed = False
        self._model: SamplingModel | PackedModel | None = None  # built on first use
        self._batch: DecodeBatch | None = None
        self._thread = threading.Thread(target=self._run, name="local-sampler", daemon=True)
        self._thread.start()

    def submit(self, request: SampleRequest) -> None:
        if self._closed:
            raise RuntimeError("this sampling client's model has been closed")
        self._queue.put(request)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        adapter: AdapterWeights | None = None
        in_flight: list[SampleRequest] = []
        while True:
            batch = self._batch
            idle = batch is None or not len(batch)
            if not self._pull(block=idle and not self._backlog):
                self._fail(in_flight, RuntimeError("the decode scheduler was closed"))
                return self._fail_backlog()
            if idle and not self._backlog:
                continue
            try:
                if idle:
                    adapter = self._backlog[0].adapter
                    batch = self._batch_for(adapter)
                assert batch is not None
                joining = self._take(batch, adapter, self.max_batch_sequences - len(batch))
                in_flight += joining
                rows = [row for request in joining for row in request.rows]
                if rows:
                    batch.join(rows)
                    self.batches += 1
                    self.sequences += len(rows)
                if len(batch):
                    batch.step()
                # Answered the step their last row finished (at once for prompt logprobs only).
                done = [r for r in in_flight if all(row.stop_reason for row in r.rows)]
                for request in done:
                    in_flight.remove(request)
                    response = self._response(adapter, request)
                    if request.record is not None:
                        request.record(response)
                    _settle(request.future, value=response)
            except Exception as exc:
                if idle and not in_flight:
                    # Nothing could start on this adapter: its requests fail rather than retry.
                    in_flight = [r for r in self._backlog if r.adapter is adapter]
                    for request in in_flight:
                        self._backlog.remove(request)
                self._fail(in_flight, exc)
                in_flight, self._batch = [], None  # its state is unknown: build it afresh

    def _pull(self, block: bool) -> bool:
        """Move queued requests to the backlog (waiting for one if `block`); False on close."""
        if block:
            item = self._queue.get()
            if item is _STOP:
                return False
            self._backlog.append(item)
            # A short wait lets callers that fire together (asyncio.gather) share a prefill.
            time.sleep(self.batch_window_s)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            self._backlog.append(item)

    def _take(
        self, batch: DecodeBatch, adapter: AdapterWeights | None, room: int
    ) -> list[SampleRequest]:
        """Backlogged requests on `adapter` that fit in `room` rows, oldest first."""
        taken: list[SampleRequest] = []
        for request in list(self._backlog):
            if request.adapter is not adapter:
                continue
            if taken and len(request.rows) > room:
                break
            if not taken and len(request.rows) > room and room < self.max_batch_sequences:
                break  # a large request waits for room rather than overfilling the batch
            if len(batch) and not batch.can_take(request.rows):
                break  # it waits for the running rows to drain (a longer cache, say)
            taken.append(request)
            room -= len(request.rows)
            self._backlog.remove(request)
        return taken

    def _fail(self, requests: list[SampleRequest], error: BaseException) -> None:
        for request in requests:
            _settle(request.future, error=error)

    def _fail_backlog(self) -> None:
        self._fail(list(self._backlog), RuntimeError("the decode scheduler was closed"))
        self._backlog.clear()

    def _sampling_model(self) -> SamplingModel | PackedModel:
        """The scheduler's copy of the model in the sampling dtype (built once)."""
        if self._model is None:
            host = self.host
            dtype = resolve_sampling_dtype(
                host.sampling_dtype, next(host.model.parameters()).dtype, host.device
            )
            with host.lock:  # a consistent read of the weights while they are copied
                self._model = sampling_model(host, dtype)
        return self._model

    def _batch_for(self, adapter: AdapterWeights | None) -> DecodeBatch:
        """The scheduler's batch (built once, kept across adapters), `adapter` loaded."""
        sampling = self._sampling_model()
        sampling.load(adapter)
        if self._batch is None:
            self._batch = self._make_batch(sampling)
        return self._batch

    def _make_batch(self, sampling: SamplingModel | PackedModel) -> DecodeBatch:
        host = self.host
        pad_id = int(host.tokenizer.pad_token_id or 0)

        def decode(tokens: list[int]) -> str:
            return host.tokenizer.decode(tokens, skip_special_tokens=False)

        # No host lock when decoding: the copy's own buffers hold the adapter, and the base
        # weights it may share with the trainer are frozen.
        if isinstance(sampling, PackedModel):
            return SlotBatch(
                sampling,
                slots=self.max_batch_sequences,
                graphs=True,  # on CUDA; elsewhere the step runs eagerly
                pad_id=pad_id,
                device=host.device,
                decode=decode,
                max_positions=host.max_positions,
            )
        model = sampling.module
        if slots_wanted(host.device) and supports_slots(model):
            return SlotBatch(
                model,
                slots=self.max_batch_sequences,
                graphs=True,
                pad_id=pad_id,
                device=host.device,
                decode=decode,
                max_positions=host.max_positions,
            )
        return DynamicCacheBatch(
            model,
            pad_id=pad_id,
            device=host.device,
            decode=decode,
            max_positions=host.max_positions,
        )

    def _prompt_logprobs(
        self, adapter: AdapterWeights | None, request: SampleRequest
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Each prompt token's logprob, and what else the request asked of the same prefill."""
        ids = torch.tensor([request.prompt], device=self.host.device)
        with self.host.use(adapter) as model, torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        picked = log_probs.gather(-1, ids[0, 1:, None])[:, 0]
        out = np.full(len(request.prompt), np.nan, dtype=np.float32)
        out[1:] = picked.cpu().numpy()
        if request.prompt_logprobs_last_n > 0:
            out[: max(0, len(out) - request.prompt_logprobs_last_n)] = np.nan
        extras = {}
        if request.scoring is not None:
            last_n = request.prompt_logprobs_last_n
            extras = prompt_scores.score(log_probs, request.prompt, request.scoring, last_n)
        return out, extras

    def _response(
        self, adapter: AdapterWeights | None, request: SampleRequest
    ) -> types.SampleResponse:
        ids = request.sequence_ids or [f"{request.tag}-{next(_sequence_ids)}" for _ in request.rows]
        sequences = [
            types.SampledSequence(
                stop_reason=row.stop_reason or "length",
                sequence_id=sequence_id,
                tokens_np=np.asarray(row.tokens, dtype=np.int32),
                logprobs_np=np.asarray(row.logprobs, dtype=np.float32),
            )
            for row, sequence_id in zip(request.rows, ids, strict=True)
        ]
        prompt_logprobs: np.ndarray | None = None
        extras: dict[str, Any] = {}
        if request.prompt_logprobs_last_n >= 0 or request.scoring is not None:
            prompt_logprobs, extras = self._prompt_logprobs(adapter, request)
            if request.prompt_logprobs_last_n < 0:
                prompt_logprobs = None  # scored for the extras only
        return types.SampleResponse(
            sequences=sequences, prompt_logprobs_np=prompt_logprobs, **extras
        )
