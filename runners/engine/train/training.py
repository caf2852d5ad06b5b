"""The local training client: tinker's losses with real LoRA gradients, AdamW, checkpoints.

Requests run one at a time on the client's own worker thread, in submission order, so a loop
can submit forward_backward and optim_step back to back before waiting on either. Clients on
one base model share its weights; each holds its own adapter, gradients and optimizer state,
and its requests on the model run under its training lane's lock, a whole step's in one turn
(turns.py): two clients' steps on a lane never interleave, and the base's lanes train side by
side (host.py).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tinker import types

from runners.engine import checkpoints as ckpt
from runners.engine import heap, lora
from runners.engine.futures import LocalFuture
from runners.engine.host import AdapterWeights, LiveAdapter, ModelHost
from runners.engine.recorded_sequences import SequenceStore
from runners.engine.train.forward import DatumBatch, autocast_dtype, run_loss, validate_data
from runners.engine.train.group import GradientGroup, flatten, unflatten
from runners.engine.train.loss_scale import DynamicLossScale
from runners.engine.train.losses import resolve_config
from runners.engine.train.microbatch_budget import SMALL_BUDGET
from runners.engine.train.turns import Hold, TurnWorker

if TYPE_CHECKING:
    from runners.engine.sample.sampler import LocalSamplingClient

OPTIMIZER_FILE = "optimizer.pt"
# A float16 trainer's loss scale in OPTIMIZER_FILE (absent elsewhere and in older files).
LOSS_SCALE_KEY = "loss_scale"
# The service's sampler over an adapter snapshot (None: the base model alone) on this client's
# host, recording for stable_reinforce or not, with this client as the sampler's client.
NewSampler = Callable[[ModelHost, AdapterWeights | None, bool, str], "LocalSamplingClient"]


def _optimizer(host: ModelHost) -> torch.optim.AdamW:
    """A training client's optimizer. The hyperparameters are set from AdamParams on every
    step; these are placeholders. Its parameters are the host's, shared with other clients: it
    only steps while this client's tensors are in them (ModelHost.training), so its state is
    this client's."""
    return torch.optim.AdamW(
        list(host.params.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
    )


def _weights_from_gradients(
    batch: DatumBatch, value: torch.Tensor, logprobs: list[torch.Tensor]
) -> None:
    """Each datum's cross_entropy weights set so that its backward pass carries a custom loss
    `value` of `logprobs`: cross_entropy's loss is -sum(w * logprob), so w = -d(loss)/d(logprob)."""
    grads = torch.autograd.grad(value, logprobs, allow_unused=True)
    for inputs, grad, lp in zip(batch.inputs, grads, logprobs, strict=True):
        inputs["weights"] = -(grad if grad is not None else torch.zeros_like(lp))


class LocalTrainingClient:
    """A LoRA adapter being trained on one base model (tinker's TrainingClient surface)."""

    def __init__(
        self,
        *,
        host: ModelHost,
        spec: lora.LoraSpec,
        seed: int | None,
        open_sampler: Callable[[str, bool], LocalFuture[LocalSamplingClient]],
        new_sampler: NewSampler,
        checkpoint_dir: Path,
        tokens_per_microbatch: int = SMALL_BUDGET,
        sequences: SequenceStore | None = None,
    ) -> None:
        self._host = host  # acquired for this client; released by close()
        self._spec = spec
        self._seed = seed
        self._adapter = LiveAdapter(lora.init_tensors(host.params, seed))
        with host.training(self._adapter):
            pass  # in place from the start: the host's parameters are this client's tensors
        # The service's create_sampling_client(model_path=..., record_stability_info=...):
        # saved weights get a host of their own when they do not fit this one.
        self._open_sampler = open_sampler
        self._new_sampler = new_sampler
        # The service's recorded sequences: this client's samplers record into them and
        # stable_reinforce datums are read against them.
        self._sequences = SequenceStore() if sequences is None else sequences
        # Where save_state and save_weights_for_sampler write `<name>/<kind>` (settable).
        self.checkpoint_dir = Path(checkpoint_dir)
        self._tokens_per_microbatch = max(1, tokens_per_microbatch)
        self.model_id = f"local-{uuid.uuid4().hex[:12]}"
        self.steps = 0
        self.forward_backward_calls = 0
        self._vocab = int(host.model.get_output_embeddings().weight.shape[0])
        self._optimizer = _optimizer(host)
        # A float16 base scales its loss (None elsewhere: nothing changes for bf16 or float32).
        self._loss_scale = loss_scale_for(host)
        self._worker = TurnWorker(host.lock)
        self._closed = False
        # A rank of a run's host group (group.py): gradients summed over the ranks each step.
        self._group: GradientGroup | None = None

    # ----- training -----------------------------------------------------------------------

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        """Loss and gradients (accumulated until optim_step) for `data`."""
        return self._submit_forward(data, loss_fn, loss_fn_config, backward=True)

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        """Like forward_backward, without gradients."""
        return self._submit_forward(data, loss_fn, loss_fn_config, backward=False)

    def _submit_forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None,
        backward: bool,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        # Bad input fails here, at the call, as the hosted service refuses it at submission.
        config = resolve_config(loss_fn, loss_fn_config)
        batch = validate_data(data, loss_fn, self._vocab, self._host.max_positions, self._sequences)
        return self._worker.submit(Hold.MODEL, self._run_forward, batch, loss_fn, config, backward)

    def forward_backward_of(
        self,
        data: list[types.Datum],
        loss: Callable[[list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]],
        backward: bool = True,
    ) -> LocalFuture[types.ForwardBackwardOutput]:
        """A loss computed from the datums' target logprobs by `loss` (a server-side custom
        loss), in one request in this client's order: a forward pass for the logprobs, the loss
        and its gradient with respect to them, then (with `backward`) a backward pass of the
        linear surrogate sum(gradient * logprob), which gives the parameters the loss's own
        gradient (what the SDK's forward_backward_custom does from the client)."""
        plain = [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    "target_tokens": d.loss_fn_inputs["target_tokens"],
                    "weights": types.TensorData(data=[0.0] * d.model_input.length, dtype="float32"),
                },
            )
            for d in data
        ]
        batch = validate_data(plain, "cross_entropy", self._vocab, self._host.max_positions)
        return self._worker.submit(Hold.MODEL, self._run_loss_of, batch, loss, backward)

    def optim_step(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> LocalFuture[types.OptimStepResponse]:
        """One AdamW step on the adapter with the accumulated gradients, then zero them."""
        params = optim_params or adam_params or types.AdamParams()
        if not isinstance(params, types.AdamParams):
            raise ValueError(
                f"the local backend implements AdamW only; got {type(params).__name__}"
            )
        if self._group is None:
            return self._worker.submit(Hold.STEP_END, self._run_optim_step, params, None)
        # The ranks' sum is taken outside the lane's turn: a rank waiting for another host's
        # must not hold this host's lane (two groups on two hosts would wait on each other).
        flat = self._worker.submit(Hold.STEP_END, self._flat_grads)
        summed = self._worker.submit(Hold.NONE, _collective, self._group.sum_, flat)
        return self._worker.submit(Hold.STEP_END, self._run_optim_step, params, summed)

    def join_group(self, group: GradientGroup) -> LocalFuture[None]:
        """This client becomes `group`'s rank: its adapter is set to rank 0's (every rank
        starts from the same weights) and, from its next optim_step on, its gradients are
        summed over the ranks first. The collective runs outside the lane's turn."""
        if self._group is not None:
            raise ValueError("this model is a rank of a group already")
        tensors = list(self._adapter.tensors.values())
        flat = self._worker.submit(Hold.STEP_END, flatten, tensors, tensors)
        shared = self._worker.submit(Hold.NONE, _collective, group.broadcast_, flat)
        return self._worker.submit(Hold.STEP_END, self._take_weights, group, shared)

    # ----- checkpoints and samplers -----------------------------------------------------------

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
        *,
        refuse_existing: bool = False,
    ) -> LocalFuture[types.SaveWeightsResponse]:
        """Adapter + optimizer into `<checkpoint_dir>/<name>/state/`, replacing an older one
        (with `refuse_existing` and no `overwrite`, an older one is an error instead, checked
        in order with this client's other requests: Tinker's rule)."""
        folder = ckpt.checkpoint_folder(self.checkpoint_dir, name, ckpt.STATE_KIND)
        exclusive = refuse_existing and not overwrite
        return self._worker.submit(
            Hold.NONE, self._run_save_state, folder, user_metadata or {}, exclusive
        )

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> LocalFuture[types.SaveWeightsForSamplerResponse]:
        """A peft adapter folder `<checkpoint_dir>/<name>/sampler/` for sampling later."""
        folder = ckpt.checkpoint_folder(self.checkpoint_dir, name, ckpt.SAMPLER_KIND)
        return self._worker.submit(Hold.NONE, self._run_save_sampler, folder, user_metadata or {})

    def export_adapter(
        self, folder: Path, user_metadata: dict[str, str] | None = None
    ) -> LocalFuture[types.SaveWeightsForSamplerResponse]:
        """The adapter as a peft folder at `folder`, in the sampler checkpoint's format (the
        Tinker API's save_weights_external), in order with this client's other requests."""
        return self._worker.submit(
            Hold.NONE, self._run_save_sampler, Path(folder), user_metadata or {}
        )

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        **_: Any,
    ) -> LocalFuture[LocalSamplingClient]:
        """A sampler over a snapshot of the current adapter (nothing is written to disk); with
        `record_stability_info`, it records what it samples for stable_reinforce."""
        return self._worker.submit(Hold.NONE, self._snapshot_sampler, record_stability_info)

    def create_sampling_client(
        self,
        model_path: str,
        retry_config: Any = None,
        record_stability_info: bool = False,
        **_: Any,
    ) -> LocalFuture[LocalSamplingClient]:
        return self._open_sampler(model_path, record_stability_info)

    def create_base_sampling_client(self) -> LocalSamplingClient:
        """A sampler of the base model alone on this client's loaded weights, the adapter
        switched off (no second copy): the reference of a run's KL penalty. Ours, not
        tinker's (there: create_sampling_client(base_model=...))."""
        return self._new_sampler(self._host, None, False, self.model_id)

    def load_state(self, path: str) -> LocalFuture[None]:
        """Adapter weights from a state checkpoint (the optimizer starts fresh)."""
        return self._worker.submit(Hold.MODEL, self.restore, path, False)

    def load_state_with_optimizer(self, path: str) -> LocalFuture[None]:
        return self._worker.submit(Hold.MODEL, self.restore, path, True)

    # ----- information ----------------------------------------------------------------------

    def get_tokenizer(self) -> Any:
        return self._host.tokenizer

    def get_info(self) -> types.GetInfoResponse:
        arch = type(self._host.model.get_base_model()).__name__
        name = self._host.base_model
        return types.GetInfoResponse(
            model_id=self.model_id,
            model_data=types.ModelData(arch=arch, model_name=name, tokenizer_id=name),
            is_lora=True,
            lora_rank=self._spec.rank,
            model_name=name,
        )

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """This client's LoRA tensors by parameter name (live: do not write to them)."""
        return dict(self._adapter.tensors)

    def close(self, cancel_pending: bool = False) -> None:
        """Finish queued requests (or, with `cancel_pending`, only the one running: the others
        never run and their futures stay unresolved), then give the host back (its last user
        frees it)."""
        self._worker.shutdown(wait=True, cancel_futures=cancel_pending)
        if not self._closed:
            self._closed = True
            if self._group is not None:
                self._group.close()
            self._let_go_of_tensors()
            self._host.release()
            heap.give_back_free_memory()

    def _let_go_of_tensors(self) -> None:
        """Free the adapter, its gradients and its optimizer state now, whoever still holds
        this closed client (its caller may, for a while)."""
        self._host.leave(self._adapter)
        self._adapter = LiveAdapter({})
        self._optimizer.state.clear()

    # ----- work done on the worker thread ----------------------------------------------------

    def _run_forward(
        self, batch: DatumBatch, loss_fn: str, config: dict[str, float], backward: bool
    ) -> types.ForwardBackwardOutput:
        with self._host.training(self._adapter) as model, self._pass(batch) as budget:
            out = run_loss(
                model,
                batch,
                loss_fn,
                config,
                backward=backward,
                pad_id=int(self._host.tokenizer.pad_token_id or 0),
                token_budget=budget,
                loss_scale=self._backward_scale(batch) if backward else 1.0,
            )
            if backward:
                self.forward_backward_calls += 1
        return out

    def _backward_scale(self, batch: DatumBatch) -> float:
        """What this step's backward passes multiply the loss by (1: no loss scaling); the
        client's first backward pass sets it from `batch`'s target tokens."""
        if self._loss_scale is None:
            return 1.0
        return self._loss_scale.for_backward(sum(len(tokens) for tokens in batch.tokens))

    def _run_loss_of(
        self,
        batch: DatumBatch,
        loss: Callable[[list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]],
        backward: bool,
    ) -> types.ForwardBackwardOutput:
        pad_id = int(self._host.tokenizer.pad_token_id or 0)
        with self._host.training(self._adapter) as model, self._pass(batch) as budget:
            out = run_loss(
                model,
                batch,
                "cross_entropy",
                {},
                backward=False,
                pad_id=pad_id,
                token_budget=budget,
            )
            logprobs = [
                torch.tensor(o["logprobs"].to_numpy(), requires_grad=True)
                for o in out.loss_fn_outputs
            ]
            value, metrics = loss(logprobs)
            if backward:
                _weights_from_gradients(batch, value, logprobs)
                run_loss(
                    model,
                    batch,
                    "cross_entropy",
                    {},
                    backward=True,
                    pad_id=pad_id,
                    token_budget=budget,
                    loss_scale=self._backward_scale(batch),
                )
                self.forward_backward_calls += 1
        return types.ForwardBackwardOutput(
            loss_fn_output_type=out.loss_fn_output_type,
            loss_fn_outputs=out.loss_fn_outputs,
            metrics={"loss:sum": float(value.detach()), **metrics},
        )

    def _pass(self, batch: DatumBatch) -> AbstractContextManager[int]:
        """This client's pass on its lane, and the pass's micro-batch budget (host.py)."""
        lengths = [len(tokens) for tokens in batch.tokens]
        return self._host.shared.training_pass(self._tokens_per_microbatch, lengths)

    def _take_weights(self, group: GradientGroup, shared: LocalFuture[torch.Tensor]) -> None:
        """Rank 0's adapter (`shared`) into this client's, and the group kept."""
        tensors = list(self._adapter.tensors.values())
        with self._host.training(self._adapter), torch.no_grad():
            for mine, theirs in zip(tensors, unflatten(shared.result(), tensors), strict=True):
                mine.copy_(theirs)
        self._group = group

    def _flat_grads(self) -> torch.Tensor:
        """This rank's gradients in one buffer, unscaled (a float16 trainer's ranks may scale
        their losses differently; their sum is taken unscaled), then one number a parameter:
        1 where it has a gradient (summed: whether any rank's pass reached it)."""
        with self._host.training(self._adapter):
            params = list(self._host.params.values())
            grads = [p.grad for p in params]
            if self._loss_scale is not None:
                self._loss_scale.unscale_([g for g in grads if g is not None])
            flat = flatten(grads, params)
            reached = [0.0 if g is None else 1.0 for g in grads]
            return torch.cat([flat, torch.tensor(reached, device=flat.device)])

    def _run_optim_step(
        self, params: types.AdamParams, summed: LocalFuture[torch.Tensor] | None
    ) -> types.OptimStepResponse:
        """AdamW on the step's gradients: this client's, or (a rank of a group) the ranks'
        sum, `summed`, unscaled already."""
        host, scaler = self._host, self._loss_scale
        used_scale = None if scaler is None else scaler.scale  # None too: no backward pass yet
        with host.training(self._adapter):
            if summed is not None:
                _set_grads(list(host.params.values()), summed.result())
            grads = [p for p in host.params.values() if p.grad is not None]
            if scaler is not None and summed is None:  # unscaled before the norm and AdamW
                scaler.unscale_([p.grad for p in grads if p.grad is not None])
            norm = _clipped_norm(grads, params.grad_clip_norm)
            # A non-finite norm is an overflow (fp16) somewhere in the step's gradients: with
            # loss scaling the step is skipped rather than writing inf/nan into the adapter.
            if scaler is None or scaler.update(math.isfinite(norm)):
                self._adam_step(params)
            self._optimizer.zero_grad(set_to_none=True)
            self.steps += 1
        metrics = {
            "grad_norm": norm if math.isfinite(norm) else float("nan"),
            "learning_rate": params.learning_rate,
            "step": float(self.steps),
        }
        if scaler is not None:
            metrics["loss_scale"] = float("nan") if used_scale is None else used_scale
            metrics["skipped_steps"] = float(scaler.skipped_steps)
        return types.OptimStepResponse(metrics=metrics)

    def _adam_step(self, params: types.AdamParams) -> None:
        for group in self._optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        self._optimizer.step()

    def _record(self, user_metadata: dict[str, str]) -> dict[str, Any]:
        return {
            "base_model": self._host.base_model,
            "model_id": self.model_id,
            "lora": {
                "rank": self._spec.rank,
                "alpha": self._spec.alpha,
                "train_mlp": self._spec.train_mlp,
                "train_attn": self._spec.train_attn,
                "train_unembed": self._spec.train_unembed,
            },
            "seed": self._seed,
            "steps": self.steps,
            "forward_backward_calls": self.forward_backward_calls,
            "saved_at": time.time(),
            "user_metadata": user_metadata,
        }

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        return {name: t.detach() for name, t in self._adapter.tensors.items()}

    def _snapshot_sampler(self, record_stability_info: bool) -> LocalSamplingClient:
        # No lock: these tensors are this client's, changed only by its own optim_step, which
        # runs on this thread; another client's training swaps its own into the host.
        with torch.no_grad():
            frozen = self._host.frozen({n: t.clone() for n, t in self._adapter.tensors.items()})
        return self._new_sampler(self._host, frozen, record_stability_info, self.model_id)

    def _run_save_state(
        self, folder: Path, user_metadata: dict[str, str], exclusive: bool = False
    ) -> Any:
        if exclusive and folder.exists():
            raise FileExistsError(
                f"a state checkpoint named {folder.parent.name!r} exists; save under another "
                "name, or pass overwrite=True to replace it"
            )

        def build(tmp: Path) -> None:
            lora.save_adapter(self._host.model, tmp, self._live_tensors())
            saved = {
                "optimizer": self._optimizer.state_dict(),
                "param_names": list(self._host.params),
            }
            if self._loss_scale is not None:
                saved[LOSS_SCALE_KEY] = self._loss_scale.state_dict()
            torch.save(saved, tmp / OPTIMIZER_FILE)
            record = {"format": ckpt.STATE_FORMAT, **self._record(user_metadata)}
            ckpt.write_record(tmp, ckpt.STATE_RECORD, record)

        with self._host.lock:
            ckpt.publish(folder, build)
        return types.SaveWeightsResponse(path=str(folder))

    def _run_save_sampler(self, folder: Path, user_metadata: dict[str, str]) -> Any:
        def build(tmp: Path) -> None:
            lora.save_adapter(self._host.model, tmp, self._live_tensors())
            record = {"format": ckpt.SAMPLER_FORMAT, **self._record(user_metadata)}
            ckpt.write_record(tmp, ckpt.SAMPLER_RECORD, record)

        with self._host.lock:
            ckpt.publish(folder, build)
        return types.SaveWeightsForSamplerResponse(path=str(folder))

    def restore(self, path: str, with_optimizer: bool, verify: bool = True) -> None:
        """Load a state checkpoint into this client (runs on the caller's thread). Its manifest
        is checked first unless the caller just did (`verify=False`)."""
        folder, record = ckpt.find_state(path, verify=verify)
        if record.get("base_model") != self._host.base_model:
            raise ValueError(
                f"{path} was saved from {record.get('base_model')!r}, "
                f"this client trains {self._host.base_model!r}"
            )
        tensors, _ = lora.load_adapter(folder)
        adapter = self._host.adapter_from_file(tensors)
        with self._host.training(self._adapter), torch.no_grad():
            for name, tensor in adapter.tensors.items():
                self._adapter.tensors[name].copy_(tensor)
            if with_optimizer:
                saved = torch.load(folder / OPTIMIZER_FILE, map_location=self._host.device)
                if saved["param_names"] != list(self._host.params):
                    raise ValueError(f"{path}: optimizer state does not match this adapter")
                self._optimizer.load_state_dict(saved["optimizer"])
                if self._loss_scale is not None and LOSS_SCALE_KEY in saved:
                    self._loss_scale.load_state_dict(saved[LOSS_SCALE_KEY])
                self.steps = int(record.get("steps", 0))
                self.forward_backward_calls = int(record.get("forward_backward_calls", 0))
            else:
                # Weights only: forget the moments gathered for the weights just replaced.
                self._optimizer.state.clear()
                self._optimizer.zero_grad(set_to_none=True)


def loss_scale_for(host: ModelHost) -> DynamicLossScale | None:
    """Dynamic loss scaling where training runs under fp16 autocast (a float16 base on CUDA):
    fp16's range is too narrow for unscaled gradients. None elsewhere."""
    half = autocast_dtype(host.device, host.model)
    return DynamicLossScale() if half == torch.float16 else None


def _collective(
    operation: Callable[[torch.Tensor], None], flat: LocalFuture[torch.Tensor]
) -> torch.Tensor:
    """`operation` (a group's sum or broadcast) on the buffer an earlier request made."""
    buffer = flat.result()
    operation(buffer)
    return buffer


def _set_grads(params: list[torch.nn.Parameter], summed: torch.Tensor) -> None:
    """The ranks' summed gradients (`_flat_grads`' layout) into `params`; a parameter no
    rank's pass reached keeps none, as on one host (AdamW then leaves it be)."""
    flat, reached = summed[: -len(params)], summed[-len(params) :].tolist()
    for param, grad, any_rank in zip(params, unflatten(flat, params), reached, strict=True):
        if not any_rank:
            param.grad = None
        else:
            param.grad = grad.clone() if param.grad is None else param.grad.copy_(grad)


def _clipped_norm(grads: list[torch.nn.Parameter], max_norm: float) -> float:
    """The gradients' total norm (inf or nan where any is), clipped to `max_norm` when > 0."""
    if not grads:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
    return float(torch.nn.utils.get_total_norm([p.grad for p in grads if p.grad is not None]))
