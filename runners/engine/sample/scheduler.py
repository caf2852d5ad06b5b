"""The decode scheduler behind sampling clients: one thread and one sampling copy per base
model, continuous batching over many adapters.

Every sampler on a base model (any adapter, any LoRA shape, or none) submits here. A request
that arrives while the batch decodes joins it at the next step (its prefill done alongside),
its rows decoding with its adapter's slot in the sampling copy (`adapter_table.py`), beside
rows of other adapters; turns between clients are fair (`admission.py`); each request is
answered the step its last row finishes. What a request asks of its prompt (logprobs, top-k,
targets) is scored as it joins, on the same copy with its adapter, never on the trainer's
model. A model the packed forward does not take decodes through transformers with one slot:
rows of another adapter wait until the batch drains. A scheduler ends with the last host that
used it, and its thread lets go of everything it built (the sampling copy, its slots, the batch
and its cache) before it ends.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
import torch
from tinker import types

from runners.engine import heap, openmp
from runners.engine.futures import LocalFuture
from runners.engine.host import AdapterWeights, ModelHost, SharedBase
from runners.engine.sample import admission, prompt_scores
from runners.engine.sample.adapter_table import AdapterTable
from runners.engine.sample.batch import DecodeBatch, Row
from runners.engine.sample.dynamic_batch import DynamicCacheBatch
from runners.engine.sample.packed_model import PackedModel, packable
from runners.engine.sample.product_routes import routes_for
from runners.engine.sample.prompt_scores import PromptScoring
from runners.engine.sample.sampling_model import SamplingModel, resolve_sampling_dtype
from runners.engine.sample.slot_batch import SlotBatch
from runners.engine.sample.slot_cache import supports as supports_slots

_STOP = object()
CLOSED = "this sampling client's model has been closed"
_sequence_ids = count(1)
_arrivals = count(1)


@dataclass(frozen=True)
class _Closed:
    """An adapter whose sampler closed (its slot empties once no request holds it)."""

    adapter: int


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
    # Who asked (a session, a trainer, a caller): admission takes turns between clients.
    client: str = ""
    order: int = field(default_factory=lambda: next(_arrivals))
    slot: int | None = None  # its adapter's slot while it is admitted
    # What it asked of its prompt, scored as it joined: logprobs and the extras.
    scored: tuple[np.ndarray, dict[str, Any]] | None = None

    @property
    def scores_prompt(self) -> bool:
        return self.prompt_logprobs_last_n >= 0 or self.scoring is not None


def _settle(future: LocalFuture, value: Any = None, error: BaseException | None = None) -> None:
    """Complete a future unless it is already done (a caller may have cancelled it)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


_schedulers: weakref.WeakKeyDictionary[SharedBase | ModelHost, DecodeScheduler] = (
    weakref.WeakKeyDictionary()
)
_schedulers_lock = threading.Lock()


def scheduler_for(host: ModelHost) -> DecodeScheduler:
    """The decode scheduler of the host's base model (of the host alone where the model is not
    packed: transformers' copy holds one LoRA shape), started on first use and closed with the
    last host that used it."""
    if host.closed:
        raise RuntimeError(CLOSED)
    key: SharedBase | ModelHost = host.shared if packing_wanted(host) else host
    with _schedulers_lock:
        scheduler = _schedulers.get(key)
        if scheduler is None or scheduler.closed:
            scheduler = DecodeScheduler(
                host,
                max_batch_sequences=host.max_batch_sequences,
                batch_window_s=host.batch_window_s,
            )
            _schedulers[key] = scheduler
        new = scheduler.attach(host)
    # Outside the lock: a detach may close the scheduler, whose thread takes the lock to end.
    if new and not host.on_close(lambda: scheduler.detach(host)):
        scheduler.detach(host)  # the host closed meanwhile: it would never detach
        raise RuntimeError(CLOSED)
    return scheduler


def adapter_closed(host: ModelHost, adapter: int) -> None:
    """The sampler of adapter `adapter` (its id) on `host` closed: the scheduler that may hold
    it in a slot (if one runs) empties that slot."""
    key: SharedBase | ModelHost = host.shared if packing_wanted(host) else host
    with _schedulers_lock:
        scheduler = _schedulers.get(key)
    if scheduler is not None and not scheduler.closed:
        scheduler.forget(adapter)


def _unregister(scheduler: DecodeScheduler) -> None:
    """A closed scheduler out of the registry (it would hold its key, and so itself, alive)."""
    with _schedulers_lock:
        for key, known in list(_schedulers.items()):
            if known is scheduler:
                del _schedulers[key]


def loads() -> tuple[int, int]:
    """Adapters resident in every live scheduler's slots, and the sample requests waiting for
    a place in a batch, summed (the engine host's status)."""
    with _schedulers_lock:
        schedulers = [s for s in _schedulers.values() if not s.closed]
    resident = sum(sum(1 for a, _ in s.resident() if a) for s in schedulers)
    return resident, sum(s.waiting for s in schedulers)


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
        return PackedModel(
            host, dtype, routes_for(host.device, dtype, kernel=host.cpu_adapter_kernel)
        )
    return SamplingModel(host, dtype)


class DecodeScheduler:
    """A daemon thread that batches sample requests for one base model (or one host)."""

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
        self._table: AdapterTable | None = None
        self._batch: DecodeBatch | None = None
        self._live: Counter[str] = Counter()  # rows of admitted requests, by client
        self._closed_adapters: set[int] = set()  # their samplers closed: their slots empty
        self._hosts: dict[int, ModelHost] = {}  # the hosts using it: the last one's close ends it
        self._hosts_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="local-sampler", daemon=True)
        self._thread.start()

    def attach(self, host: ModelHost) -> bool:
        """Count `host` as a user; whether it is new."""
        with self._hosts_lock:
            new = id(host) not in self._hosts
            self._hosts[id(host)] = host
            return new

    def detach(self, host: ModelHost) -> None:
        """`host` closed: the scheduler closes with its last user. Until then it reads another
        host on the base (the same weights): a closed host, a lane's, goes."""
        with self._hosts_lock:
            self._hosts.pop(id(host), None)
            if self.host is host and self._hosts:
                self.host = next(iter(self._hosts.values()))
            last = not self._hosts
        if last:
            self.close()

    def submit(self, request: SampleRequest) -> None:
        if self._closed:
            raise RuntimeError(CLOSED)
        self._queue.put(request)

    def forget(self, adapter: int) -> None:
        """Adapter `adapter`'s sampler closed: its slot empties (after the requests before)."""
        self._queue.put(_Closed(adapter))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    @property
    def waiting(self) -> int:
        """Requests not yet in the batch (an estimate: read without the thread's lock)."""
        return len(self._backlog) + self._queue.qsize()

    def resident(self) -> list[tuple[int | None, int]]:
        """The adapters in the sampling copy's slots now (id, requests holding it)."""
        return self._table.resident() if self._table is not None else []

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._let_go_of_everything()

    def _let_go_of_everything(self) -> None:
        """The thread's end: the sampling copy, its slots and the batch go, and their memory."""
        self._closed = True  # were it to end on an error: no request waits for it in vain
        _unregister(self)
        self._model, self._table, self._batch = None, None, None
        self._backlog.clear()
        heap.give_back_free_memory()

    def _serve(self) -> None:
        in_flight: list[SampleRequest] = []
        while True:
            batch = self._batch
            idle = batch is None or not len(batch)
            if not self._pull(block=idle and not self._backlog and not in_flight):
                self._fail(in_flight, RuntimeError("the decode scheduler was closed"))
                return self._fail_backlog()
            self._empty_closed_slots()
            if idle and not self._backlog and not in_flight:
                continue
            try:
                batch = self._ready_batch()
            except Exception as exc:
                # Nothing can decode without the model: what waits fails rather than retries.
                self._fail_backlog(exc)
                continue
            try:
                joining = self._admit(batch)
                if idle and not in_flight and not joining and self._backlog:
                    # Never expected (an idle batch has room and free slots): fail, not spin.
                    self._fail_backlog(RuntimeError("the sampler could admit no waiting request"))
                    continue
                in_flight += joining
                self._join(batch, joining)
                if len(batch):
                    batch.step()
                self._answer_finished(in_flight)
            except Exception as exc:
                for request in in_flight:
                    self._let_go(request)
                self._fail(in_flight, exc)
                in_flight, self._batch = [], None  # its state is unknown: build it afresh

    def _join(self, batch: DecodeBatch, joining: list[SampleRequest]) -> None:
        """The rows of the requests admitted now into `batch`, in slot order: a batch that
        forms at once holds each adapter's rows together, which the CPU's products read as
        blocks without gathering (row_adapters.py)."""
        joining.sort(key=lambda request: request.slot or 0)
        rows = [row for request in joining for row in request.rows]
        if rows:
            batch.join(rows)
            self.batches += 1
            self.sequences += len(rows)

    def _answer_finished(self, in_flight: list[SampleRequest]) -> None:
        """Answer, and take out of `in_flight`, the requests whose last row finished this step
        (at once for prompt logprobs only)."""
        done = [r for r in in_flight if all(row.stop_reason for row in r.rows)]
        for request in done:
            in_flight.remove(request)
            self._answer(request)
        if done:
            self._empty_closed_slots()  # a closed adapter's last request may be over

    def _admit(self, batch: DecodeBatch) -> list[SampleRequest]:
        """Backlogged requests that join now (fair turns; admission.py), their adapters in
        slots, their rows told the slot, their prompts scored if asked."""
        wanted = {r.adapter.id for r in self._backlog if r.adapter is not None}
        admitted = admission.admit(
            list(self._backlog),
            self._live,
            capacity=self.max_batch_sequences,
            running=len(batch),
            fits=batch.can_take,
            hold=lambda request: self._hold(request, wanted),
        )
        for request, error in admitted.refused:
            self._backlog.remove(request)
            _settle(request.future, error=error)
        joining = []
        for request in admitted.joining:
            self._backlog.remove(request)
            self._live[request.client] += len(request.rows)
            try:
                if request.scores_prompt:
                    request.scored = self._score(request)
            except Exception as exc:
                self._let_go(request)
                _settle(request.future, error=exc)
                continue
            joining.append(request)
        return joining

    def _hold(self, request: SampleRequest, wanted: set[int]) -> bool:
        """Give `request` its adapter's slot; `wanted`: the adapters of the waiting requests
        (kept in their slots while another can be evicted)."""
        assert self._table is not None
        slot = self._table.hold(request.adapter, wanted)
        if slot is None:
            return False
        request.slot = slot
        for row in request.rows:
            row.adapter_slot = slot
        return True

    def _let_go(self, request: SampleRequest) -> None:
        """The request is over: its slot and its place in its client's share go."""
        if request.slot is not None and self._table is not None:
            self._table.let_go(request.slot)
            request.slot = None
        self._live[request.client] -= len(request.rows)
        if self._live[request.client] <= 0:
            del self._live[request.client]

    def _empty_closed_slots(self) -> None:
        """The slots of adapters whose samplers closed empty, and the memory of the slots that
        close with them goes; an adapter a request holds, or one still waits on (it was sent
        before the close), waits for that request to be over."""
        if not self._closed_adapters or self._table is None:
            return
        waiting = {r.adapter.id for r in self._backlog if r.adapter is not None}
        wanted = self._closed_adapters & waiting
        opened = len(self._table.resident())
        self._closed_adapters = self._table.empty(self._closed_adapters - wanted) | wanted
        if len(self._table.resident()) < opened:
            heap.give_back_free_memory()

    def _answer(self, request: SampleRequest) -> None:
        self._let_go(request)
        response = self._response(request)
        if request.record is not None:
            request.record(response)
        _settle(request.future, value=response)

    def _pull(self, block: bool) -> bool:
        """Move queued requests to the backlog (waiting for one if `block`); False on close."""
        if block:
            openmp.give_back_workers()  # idle: its workers go till the next batch (openmp.py)
            item = self._queue.get()
            if item is _STOP:
                return False
            self._take(item)
            # A short wait lets callers that fire together (asyncio.gather) share a prefill.
            time.sleep(self.batch_window_s)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            self._take(item)

    def _take(self, item: SampleRequest | _Closed) -> None:
        if isinstance(item, _Closed):
            self._closed_adapters.add(item.adapter)
        else:
            self._backlog.append(item)

    def _fail(self, requests: list[SampleRequest], error: BaseException) -> None:
        for request in requests:
            _settle(request.future, error=error)

    def _fail_backlog(self, error: BaseException | None = None) -> None:
        error = error or RuntimeError("the decode scheduler was closed")
        self._fail(list(self._backlog), error)
        self._backlog.clear()

    def _sampling_model(self) -> SamplingModel | PackedModel:
        """The scheduler's copy of the model in the sampling dtype (built once)."""
        if self._model is None:
            host = self.host
            dtype = resolve_sampling_dtype(
                host.sampling_dtype, next(host.model.parameters()).dtype, host.device
            )
            with host.lock:  # a consistent read of the weights while they are copied
                model = sampling_model(host, dtype)
            self._table = AdapterTable(
                model.slots,
                model.load,
                base_takes_slot=isinstance(model, SamplingModel),
                shrink=model.shrink if isinstance(model, PackedModel) else None,
            )
            self._model = model
        return self._model

    def _ready_batch(self) -> DecodeBatch:
        """The scheduler's batch (built once, kept across adapters)."""
        sampling = self._sampling_model()
        if self._batch is None:
            self._batch = self._make_batch(sampling)
        return self._batch

    def _make_batch(self, sampling: SamplingModel | PackedModel) -> DecodeBatch:
        host = self.host
        pad_id = int(host.tokenizer.pad_token_id or 0)
        tokenizer = host.tokenizer  # not the host: the batch outlives a lane's host

        def decode(tokens: list[int]) -> str:
            return tokenizer.decode(tokens, skip_special_tokens=False)

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

    def _score(self, request: SampleRequest) -> tuple[np.ndarray, dict[str, Any]]:
        """Each prompt token's logprob, and what else the request asked of the same prompt,
        on the sampling copy with the request's adapter (its slot is held)."""
        assert self._model is not None and request.slot is not None
        with torch.no_grad():
            logits = self._model.score(request.prompt, request.slot)[:-1].float()
        ids = torch.tensor(request.prompt, device=logits.device)
        log_probs = torch.log_softmax(logits, dim=-1)
        picked = log_probs.gather(-1, ids[1:, None])[:, 0]
        out = np.full(len(request.prompt), np.nan, dtype=np.float32)
        out[1:] = picked.cpu().numpy()
        if request.prompt_logprobs_last_n > 0:
            out[: max(0, len(out) - request.prompt_logprobs_last_n)] = np.nan
        extras = {}
        if request.scoring is not None:
            last_n = request.prompt_logprobs_last_n
            extras = prompt_scores.score(log_probs, request.prompt, request.scoring, last_n)
        return out, extras

    def _response(self, request: SampleRequest) -> types.SampleResponse:
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
        if request.scored is not None:
            prompt_logprobs, extras = request.scored
            if request.prompt_logprobs_last_n < 0:
                prompt_logprobs = None  # scored for the extras only
        return types.SampleResponse(
            sequences=sequences, prompt_logprobs_np=prompt_logprobs, **extras
        )
