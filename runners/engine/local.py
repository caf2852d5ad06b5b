"""The embedded local backend's entry point: a ServiceClient shaped like tinker's (SDK 0.38).

Everything it needs is passed in (paths, device, dtype); it reads no environment variables.
Training and sampling clients live in training.py and sampler.py; each base model is loaded
once and shared by every client on it (bases.py).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from core.model_names import validate_device_dtype
from runners.engine import checkpoints as ckpt
from runners.engine import lora, openmp
from runners.engine.bases import BaseModels, weight_files_bytes
from runners.engine.futures import LocalFuture, resolved, submit
from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.recorded_sequences import SequenceStore
from runners.engine.sample.sampler import LocalSamplingClient
from runners.engine.train import microbatch_budget
from runners.engine.train.training import LocalTrainingClient
from runners.models import loading

__all__ = ["LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient"]


class LocalServiceClient:
    """Creates LoRA training clients and sampling clients on this machine (CPU or CUDA).

    `tokens_per_microbatch`: padded tokens per training forward/backward pass; None picks it
    per base model from the device's memory and the model's shape (microbatch_budget.py).
    `sequences`: where samplers made with record_stability_info record what they sample for
    stable_reinforce (a day's lifetime, 512 MiB by default; recorded_sequences.py).
    `adapter_slots`: adapters the sampler of a base model decodes side by side (1: one at a
    time); `max_lora_rank`: the largest LoRA rank it takes (sample/packed_group.py);
    `cpu_adapter_kernel`: a bf16 CPU sampler's updates through the fused kernel (lora_rows.py);
    `cast_lm_head_to_fp32`: a lower-precision sampler's logits from a float32 unembedding
    (sample/packed_model.py);
    `training_lanes`: training passes of different clients on one base side by side (host.py);
    `device_share`: engines sharing the device (engine hosts on one GPU), whose memory each
    sizes its micro-batches from a share of."""

    def __init__(
        self,
        *,
        checkpoint_dir: Path,
        models_dir: Path,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_sequences: int = 64,
        batch_window_s: float = 0.005,
        sampling_dtype: str = "auto",
        tokens_per_microbatch: int | None = None,
        memory_budget_bytes: int | None = None,
        sequences: SequenceStore | None = None,
        adapter_slots: int = 8,
        max_lora_rank: int = 128,
        cpu_adapter_kernel: bool = True,
        training_lanes: int = 1,
        device_share: int = 1,
        cast_lm_head_to_fp32: bool = True,
    ) -> None:
        validate_device_dtype(device, dtype)
        validate_device_dtype(device, sampling_dtype)
        torch_device = loading.resolve_device(device)
        loading.refuse_float16_off_cuda(
            sampling_dtype, torch_device, "sampling_dtype (RLCS_SAMPLING_DTYPE)"
        )
        self.device = str(torch_device)
        self.dtype = str(loading.resolve_dtype(dtype, torch_device)).removeprefix("torch.")
        self.checkpoint_dir = Path(checkpoint_dir)
        self.models_dir = Path(models_dir)
        host_options = {
            "max_batch_sequences": max_batch_sequences,
            "batch_window_s": batch_window_s,
            "sampling_dtype": sampling_dtype,
            "adapter_slots": adapter_slots,
            "max_lora_rank": max_lora_rank,
            "cpu_adapter_kernel": cpu_adapter_kernel,
            "cast_lm_head_to_fp32": cast_lm_head_to_fp32,
        }
        self.max_lora_rank = max_lora_rank
        self.bases = BaseModels(
            self._load, host_options, memory_budget_bytes, self._estimate, training_lanes
        )
        self._tokens_per_microbatch = tokens_per_microbatch
        self._device_share = device_share
        # Session-scoped: every client of this service records into and reads from it.
        self.sequences = SequenceStore() if sequences is None else sequences
        self._lock = threading.Lock()
        self._training_clients: list[LocalTrainingClient] = []
        # Model loading is slow (seconds); it runs here so the caller gets a future at once.
        self._loader = openmp.WorkersFreeExecutor(max_workers=1, thread_name_prefix="local-service")
        self._closed = False

    # ----- training clients -----------------------------------------------------------------

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
    ) -> LocalFuture[LocalTrainingClient]:
        """A new LoRA adapter (alpha 32) on `base_model`, initialised from `seed`."""
        spec = lora.LoraSpec(rank, train_mlp, train_attn, train_unembed)
        self._check_rank(rank)
        self._check_optimizer(optimizer)
        return submit(self._loader, self._new_training_client, base_model, spec, seed)

    def create_training_client_from_state(
        self, path: str, base_model: str | None = None, **_: Any
    ) -> LocalFuture[LocalTrainingClient]:
        """A training client with the weights of a state checkpoint and a fresh optimizer."""
        return self._from_state(path, base_model, with_optimizer=False)

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None, **_: Any
    ) -> LocalFuture[LocalTrainingClient]:
        """A training client with the weights and AdamW state of a checkpoint (to resume)."""
        return self._from_state(path, base_model, with_optimizer=True)

    # ----- sampling clients -----------------------------------------------------------------

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        **_: Any,
    ) -> LocalFuture[LocalSamplingClient]:
        """A sampler over saved sampler weights (`model_path`) or over the bare `base_model`;
        with `record_stability_info`, it records what it samples for stable_reinforce."""
        self._check_open()
        if model_path is not None:
            folder, record = ckpt.find_sampler(model_path)
            return submit(
                self._loader, self._sampler_from_folder, folder, record, record_stability_info
            )
        if base_model is None:
            raise ValueError("create_sampling_client needs model_path or base_model")
        return submit(self._loader, self._base_sampler, base_model, record_stability_info)

    def sampling_load(self) -> tuple[int, int]:
        """Adapters resident in the samplers' slots, and sample requests waiting for a batch."""
        from runners.engine.sample.scheduler import loads

        return loads()

    def forget(self, client: LocalTrainingClient, cancel_pending: bool = False) -> None:
        """Close a training client (after its queued requests, or dropping them) and free
        what only it used."""
        with self._lock:
            if client in self._training_clients:
                self._training_clients.remove(client)
        client.close(cancel_pending)

    def close(self, status: str = "success", detail: str | None = None) -> LocalFuture[None]:
        """Stop every worker and sampling engine of this service."""
        with self._lock:
            self._closed = True
            clients = list(self._training_clients)
        for client in clients:
            client.close()
        self.bases.close()
        self._loader.shutdown(wait=False)
        return resolved(None)

    def __enter__(self) -> LocalServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- helpers ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LocalServiceClient is closed")

    def _check_rank(self, rank: int) -> None:
        if rank > self.max_lora_rank:
            raise ValueError(
                f"lora_rank {rank} is above the largest this engine samples, "
                f"{self.max_lora_rank} (RLCS_MAX_LORA_RANK): use a lower rank or raise it"
            )

    @staticmethod
    def _check_optimizer(optimizer: Any) -> None:
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError("the local backend implements the AdamW optimizer only")

    def _load(self, base_model: str) -> tuple[Any, Any]:
        return loading.load_model_and_tokenizer(
            base_model, self.models_dir, device=self.device, dtype=self.dtype
        )

    def _estimate(self, base_model: str) -> int | None:
        folder = loading.weights_folder(base_model, self.models_dir)
        return weight_files_bytes(folder) if folder is not None else None

    def _new_training_client(
        self, base_model: str, spec: lora.LoraSpec, seed: int | None
    ) -> LocalTrainingClient:
        self._check_open()
        host = self.bases.lora_host(base_model, spec)
        try:
            client = LocalTrainingClient(
                host=host,
                spec=spec,
                seed=seed,
                open_sampler=lambda path, record: self.create_sampling_client(
                    model_path=path, record_stability_info=record
                ),
                new_sampler=self._new_sampler,
                checkpoint_dir=self.checkpoint_dir,
                tokens_per_microbatch=self._microbatch_budget(host),
                sequences=self.sequences,
            )
        except Exception:
            host.release()
            raise
        with self._lock:
            self._training_clients.append(client)
        return client

    def _microbatch_budget(self, host: ModelHost) -> int:
        if self._tokens_per_microbatch is not None:
            return self._tokens_per_microbatch
        device = torch.device(self.device)
        weight = host.model.get_output_embeddings().weight
        memory = microbatch_budget.device_memory_bytes(device)
        return microbatch_budget.default_tokens_per_microbatch(
            device.type,
            None if memory is None else memory // self._device_share,
            microbatch_budget.model_shape(getattr(host.model, "config", None), weight.dtype),
        )

    def _from_state(
        self, path: str, base_model: str | None, *, with_optimizer: bool
    ) -> LocalFuture[LocalTrainingClient]:
        self._check_open()
        # The record only, at once (a wrong path or model fails here); the files are checked
        # against the manifest on the loader thread, before any model is loaded.
        folder, record = ckpt.find_state(path, verify=False)
        if base_model is not None and base_model != record["base_model"]:
            raise ValueError(
                f"{path} holds an adapter for {record['base_model']!r}, not {base_model!r}"
            )
        spec = lora.LoraSpec(**record["lora"])
        self._check_rank(spec.rank)

        def create() -> LocalTrainingClient:
            ckpt.find_state(folder)
            client = self._new_training_client(record["base_model"], spec, record.get("seed"))
            try:
                client.restore(str(folder), with_optimizer, verify=False)
            except Exception:
                self.forget(client)
                raise
            return client

        return submit(self._loader, create)

    def _new_sampler(
        self, host: ModelHost, adapter: AdapterWeights | None, record: bool, client: str
    ) -> LocalSamplingClient:
        """A sampler over `adapter` (None: the base model) on `host`, holding the host."""
        host.acquire()  # the sampler's own hold: it may outlive the client that made it
        return LocalSamplingClient(
            host,
            adapter,
            release=host.release,
            record_stability_info=record,
            sequences=self.sequences,
            client=client,
        )

    def _sampler_from_folder(
        self, folder: Path, record: dict[str, Any], record_stability_info: bool
    ) -> LocalSamplingClient:
        self._check_open()
        tensors, config = lora.load_adapter(folder)
        self._check_rank(int(config.r))
        host = self.bases.host_for_config(record["base_model"], config)
        try:
            adapter = host.adapter_from_file(tensors)
        except Exception:
            host.release()
            raise
        return LocalSamplingClient(
            host,
            adapter,
            model_path=str(folder),
            release=host.release,
            record_stability_info=record_stability_info,
            sequences=self.sequences,
        )

    def _base_sampler(self, base_model: str, record_stability_info: bool) -> LocalSamplingClient:
        self._check_open()
        host = self.bases.bare_host(base_model)
        return LocalSamplingClient(
            host,
            None,
            release=host.release,
            record_stability_info=record_stability_info,
            sequences=self.sequences,
        )
