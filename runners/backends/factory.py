"""Choose and build the training backend for a run: tinker (hosted) or local (torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.settings import Settings

if TYPE_CHECKING:
    from runners.engine.local import LocalServiceClient


def resolve_backend(requested: str, settings: Settings) -> Literal["local", "tinker"]:
    """`auto` means tinker when a key is set, else local."""
    if requested == "auto":
        return settings.default_backend
    if requested not in ("local", "tinker"):
        raise ValueError(f"backend must be auto, local or tinker, not {requested!r}")
    return requested  # type: ignore[return-value]


def create_service(
    backend: str,
    settings: Settings,
    checkpoint_dir: Path,
    *,
    engine: str = "private",
    client: str = "",
    base_model: str | None = None,
    role: Literal["run", "inference"] = "run",
) -> Any:
    """A tinker-shaped service client; heavy imports happen only for the backend chosen. On
    the local backend, `engine` "shared" is an engine host, the one placed for `base_model`
    (`client` names what it holds there: a run's id, as `role`), "private" a copy of the
    engine in this process."""
    if backend == "tinker":
        from runners.backends.tinker_backend import create_tinker_service

        key = settings.tinker_api_key.get_secret_value() if settings.tinker_api_key else None
        return create_tinker_service(
            key, settings.tinker_base_url, timeout_s=settings.tinker_create_timeout_s
        )
    if engine == "shared":
        from runners.backends.engine_backend import EngineService

        return EngineService(settings, client, checkpoint_dir, base_model, role)
    return local_service(settings, checkpoint_dir)


def local_service(
    settings: Settings,
    checkpoint_dir: Path,
    memory_budget_bytes: int | None = None,
    device_share: int = 1,
) -> LocalServiceClient:
    """The local engine as the settings configure it (a private run's, or an engine host's:
    `device_share` hosts on its device)."""
    from runners.engine.local import LocalServiceClient

    return LocalServiceClient(
        checkpoint_dir=checkpoint_dir,
        models_dir=settings.models_dir,
        device=settings.device,
        dtype=settings.dtype,
        sampling_dtype=settings.sampling_dtype,
        adapter_slots=settings.adapter_slots,
        max_lora_rank=settings.max_lora_rank,
        cpu_adapter_kernel=settings.cpu_adapter_kernel,
        cast_lm_head_to_fp32=settings.cast_lm_head_to_fp32,
        training_lanes=settings.training_lanes,
        tokens_per_microbatch=settings.tokens_per_microbatch,
        memory_budget_bytes=memory_budget_bytes,
        device_share=device_share,
    )


def run_engine(requested: str, settings: Settings) -> Literal["shared", "private"]:
    """A run config's `engine`: auto is RLCS_RUN_ENGINE."""
    if requested == "auto":
        return settings.run_engine
    if requested not in ("shared", "private"):
        raise ValueError(f"engine must be auto, shared or private, not {requested!r}")
    return requested  # type: ignore[return-value]
