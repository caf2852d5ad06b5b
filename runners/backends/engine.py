"""The batching engine behind sampling clients: one thread per model, one batch per round.

It collects the requests queued while the previous batch ran and decodes those that share a
weights snapshot as one left-padded batch (decoding.py): N concurrent callers cost about one
batched generation.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import torch
from tinker import types

from runners.backends.decoding import Row, decode_batch
from runners.backends.futures import LocalFuture
from runners.backends.host import AdapterWeights, ModelHost

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


def _settle(future: LocalFuture, value: Any = None, error: BaseException | None = None) -> None:
    """Complete a future unless it is already done (a caller may have cancelled it)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


def engine_for(host: ModelHost) -> SamplingEngine:
    """The host's one sampling engine, started on first use and closed with the host."""
    with host.attach_lock:
        engine = host.attached.get("sampling_engine")
        if engine is None:
            engine = SamplingEngine(
                host,
                max_batch_sequences=host.max_batch_sequences,
                batch_window_s=host.batch_window_s,
            )
            host.attached["sampling_engine"] = engine
            host.on_close(engine.close)
        return engine


class SamplingEngine:
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
        self._thread = threading.Thread(target=self._run, name="local-sampler", daemon=True)
        self._thread.start()

    def submit(self, request: SampleRequest) -> None:
        if self._closed:
            raise RuntimeError("this sampling client's model has been closed")
        self._queue.put(request)

    def close(self) -> None:
        self._closed = True
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            if not self._backlog:
                item = self._queue.get()
                if item is _STOP:
                    return self._fail_backlog()
                self._backlog.append(item)
                # A short wait lets callers that fire together (asyncio.gather) share a batch.
                time.sleep(self.batch_window_s)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    return self._fail_backlog()
                self._backlog.append(item)
            adapter = self._backlog[0].adapter
            group = [r for r in self._backlog if r.adapter is adapter]
            self._backlog = deque(r for r in self._backlog if r.adapter is not adapter)
            self._serve(adapter, group)

    def _fail_backlog(self) -> None:
        while self._backlog:
            request = self._backlog.popleft()
            _settle(request.future, error=RuntimeError("the sampling engine was closed"))

    def _serve(self, adapter: AdapterWeights | None, group: list[SampleRequest]) -> None:
        try:
            rows = [row for request in group for row in request.rows]
            for start in range(0, len(rows), self.max_batch_sequences):
                self._decode(adapter, rows[start : start + self.max_batch_sequences])
            for request in group:
                _settle(request.future, value=self._response(adapter, request))
        except Exception as exc:
            for request in group:
                _settle(request.future, error=exc)

    def _decode(self, adapter: AdapterWeights | None, rows: list[Row]) -> None:
        if not rows:
            return
        host = self.host

        def forward(ids, mask, positions, cache) -> torch.Tensor:
            with host.use(adapter) as model, torch.no_grad():
                out = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            return out.logits[:, -1, :]

        decode_batch(
            forward,
            rows,
            pad_id=int(host.tokenizer.pad_token_id or 0),
            device=host.device,
            decode=lambda toks: host.tokenizer.decode(toks, skip_special_tokens=False),
            max_positions=host.max_positions,
        )
        self.batches += 1
        self.sequences += len(rows)

    def _prompt_logprobs(
        self, adapter: AdapterWeights | None, request: SampleRequest
    ) -> np.ndarray:
        ids = torch.tensor([request.prompt], device=self.host.device)
        with self.host.use(adapter) as model, torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        out = np.full(len(request.prompt), np.nan, dtype=np.float32)
        out[1:] = picked.cpu().numpy()
        if request.prompt_logprobs_last_n:
            out[: max(0, len(out) - request.prompt_logprobs_last_n)] = np.nan
        return out

    def _response(
        self, adapter: AdapterWeights | None, request: SampleRequest
    ) -> types.SampleResponse:
        sequences = [
            types.SampledSequence(
                stop_reason=row.stop_reason or "length",
                sequence_id=f"{request.tag}-{next(_sequence_ids)}",
                tokens_np=np.asarray(row.tokens, dtype=np.int32),
                logprobs_np=np.asarray(row.logprobs, dtype=np.float32),
            )
            for row in request.rows
        ]
        prompt_logprobs = None
        if request.prompt_logprobs_last_n >= 0:
            prompt_logprobs = self._prompt_logprobs(adapter, request)
        return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_logprobs)
