"""All settings in one object (environment variables prefixed RLCS_, plus the service keys).

Nothing else in the project reads os.environ; the runner builds the same class.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.net import is_loopback

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLCS_", extra="ignore", populate_by_name=True)

    # Where things live.
    var_dir: Path = Field(PROJECT_ROOT / "var", description="Database, run folders, model cache")
    database_url: str | None = Field(None, description="Default: sqlite file under var_dir")
    db_busy_timeout_s: float = Field(
        30.0, gt=0, description="How long a write waits for another writer's lock (then 503)"
    )
    env_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Extra environment folders: one, several joined by ':', or a JSON list",
    )
    models_path: Path | None = Field(
        None,
        validation_alias=AliasChoices("RLCS_MODELS_DIR", "models_path"),
        description="Converted model cache (default: var_dir/models)",
    )

    # Network.
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    api_token: SecretStr | None = None
    insecure_no_token: bool = Field(
        False, description="Answer clients off this machine without a token (not advised)"
    )
    read_tokens: SecretStr | None = Field(
        None, description="Comma-separated tokens that may list and watch, never change anything"
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers to (comma-separated, * for any); default: "
        "the loopback names and the bound address while the server takes no token",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web origins (https://app.example) allowed to call from a browser; none by "
        "default",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413")
    max_streams_per_client: int = Field(
        8, ge=1, description="Log-follow streams one client address may hold open at once"
    )

    # Runs.
    max_concurrent_runs: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Runs active at once (unset: 8 where runs share the engine host, "
        "RLCS_RUN_ENGINE=shared, whose memory budget admits their base models; 2 where each "
        "holds its own copy)",
    )
    stop_grace_s: float = Field(10.0, ge=0.0)
    supervisor_interval_s: float = Field(0.5, gt=0.0)
    leader_poll_s: float = Field(
        2.0, gt=0.0, description="How often a standby server tries to take over supervision"
    )
    stall_factor: float = Field(10.0, gt=1.0, description="Stalled: no step for N x step time")
    stall_min_s: float = Field(120.0, ge=0.0, description="Never stalled before this long")
    runner_module: str = Field("runners.train", description="python -m <this> --run-dir DIR")
    python_executable: str = Field(sys.executable)
    backend_call_timeout_s: float = Field(
        1800.0, gt=0.0, description="Most seconds one backend call (sample, train, save) may take"
    )
    tinker_create_timeout_s: float = Field(
        120.0, gt=0.0, description="Most seconds creating a Tinker client (a session) may take"
    )

    # Where runs execute: local subprocesses (default) or jobs on a Ray cluster.
    launcher: Literal["local", "ray"] = Field(
        "local", description="local: runs are child processes; ray: Ray jobs (RLCS_RAY_ADDRESS)"
    )
    ray_address: str = Field(
        "http://127.0.0.1:8265", description="The Ray dashboard (job submission) address"
    )
    checkpoint_dir: Path | None = Field(
        None,
        description="Where run folders and local checkpoints go (default: var_dir/runs); with "
        "Ray, a path every node sees",
    )
    export_path: Path | None = Field(
        None,
        validation_alias=AliasChoices("RLCS_EXPORT_DIR", "export_path"),
        description="The only folder (with what is under it) an export may be written to when a "
        "client names its path (default: var_dir/exports); without a path an export goes into "
        "its run's folder",
    )
    export_timeout_s: float = Field(
        900.0, gt=0.0, description="Most seconds one export (a merge, a download) may take"
    )
    # Set by the Ray launcher in a job's environment: the run's frozen spec and resume point
    # travel with the job (JSON), so its runner needs nothing from the server's disk.
    run_spec: str | None = Field(None, description="(set for a Ray job) the run's RunSpec")
    resume_point: str | None = Field(None, description="(set for a Ray job) its ResumePoint")
    ray_timeout_s: float = Field(
        5.0, gt=0.0, description="Most seconds one call to the Ray job server may take"
    )

    # Webhooks (server.webhooks.dispatch).
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts (names, IP addresses or CIDR networks, comma-separated) webhooks may "
        "point at besides loopback",
    )
    webhook_signing_key: SecretStr | None = Field(
        None,
        description="Key every webhook's signing secret is derived from (default: a random key "
        "made once in var_dir/webhook-signing.key); servers sharing a database must share it",
    )
    webhook_interval_s: float = Field(0.25, gt=0.0, description="Delivery tick")
    webhook_timeout_s: float = Field(5.0, gt=0.0, description="Most seconds one delivery may take")
    webhook_retry_base_s: float = Field(
        2.0, gt=0.0, description="First retry delay; doubling per attempt, capped at 300 s"
    )
    webhook_max_attempts: int = Field(8, ge=1, le=100, description="Then a delivery is failed")

    # Local backend.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    sampling_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="dtype of the sampler's copy of the weights; auto: bfloat16 on a CPU with "
        "native bf16 (2.5-3x faster decoding), else the model's; float32 on a CPU makes sampler "
        "and trainer logprobs agree to float32 rounding",
    )
    adapter_slots: int = Field(
        8,
        ge=1,
        le=64,
        description="LoRA adapters the local sampler decodes side by side in one batch, per "
        "base model (runs, sessions, /v1 checkpoints on one base share its decode steps); 1: "
        "one adapter at a time, requests on another waiting until the batch drains",
    )
    cpu_adapter_kernel: bool = Field(
        True,
        description="A bf16 sampler on the CPU adds its rows' LoRA updates with a fused kernel "
        "built by the machine's C compiler at first use (the torch products where none is "
        "found); false: the torch products always",
    )
    cast_lm_head_to_fp32: bool = Field(
        True,
        description="A bf16 sampler over a float32 trainer (the CPU's) computes its logits "
        "from a float32 copy of the unembedding, as the trainer does (TRL's name; bf16 logits "
        "rounded to 8 bits are most of the gap between them); false: in the sampler's dtype. "
        "A bf16 trainer on CUDA computes its logits in bf16, and so does its sampler",
    )
    training_lanes: int = Field(
        2,
        ge=1,
        le=16,
        description="Training passes of different clients on one base model that run side by "
        "side in the local engine (runs and sessions on the engine host); 1: one at a time",
    )
    max_lora_rank: int = Field(
        128,
        ge=1,
        le=512,
        description="The largest LoRA rank the local engine takes (its sampler's adapter slots "
        "grow to the largest rank loaded); a run or session asking for more is refused",
    )
    tokens_per_microbatch: int | None = Field(
        None,
        ge=1,
        description="Padded tokens per training forward/backward pass of the local backend; "
        "unset: 4096 on the CPU, on CUDA the largest power of two up to 32768 whose "
        "activations fit in a third of the GPU's memory (16384 for a 1.5B model on an H200)",
    )

    # The engine hosts (runners.engine_host): one per device, holding the models of runs, Tinker
    # sessions, /v1 and test inference (core/engine_slots.py places them).
    engine_hosts: str | None = Field(
        None,
        description="Engine hosts on this machine: unset, one per visible GPU (one on a machine "
        "without a GPU); N, that many (at most the GPUs, or on a CPU-only machine its cores, "
        "which the hosts split); or the GPU of each host, comma-separated (0,0,1: two hosts "
        "share GPU 0, each with half its budget)",
    )
    engine_memory_budget_gb: float | None = Field(
        None,
        gt=0,
        validation_alias=AliasChoices(
            "RLCS_ENGINE_MEMORY_BUDGET_GB",
            "RLCS_TINKER_MEMORY_BUDGET_GB",
            "engine_memory_budget_gb",
        ),
        description="Weights of the base models one device's engine hosts may hold at once "
        "(GiB; hosts sharing a device split it); unset: 8 on the CPU, 45% of a GPU's memory "
        "(a base costs about twice its weights there: the sampler's packed copy beside the "
        "trainer's). A run, session or request asking for one more model past it waits or is "
        "refused, saying what is loaded (RLCS_TINKER_MEMORY_BUDGET_GB, its former name, still "
        "works)",
    )
    engine_slot: str | None = Field(
        None,
        description="(set by whoever starts an engine host, in its environment) which host of "
        "its machine it is, as JSON",
    )
    node_name: str = Field(
        default_factory=socket.gethostname,
        description="This machine's name: its engine hosts' folders under var_dir/engine are "
        "keyed by it, so a var/ shared between machines stays correct",
    )
    cuda_visible_devices: str | None = Field(
        None,
        validation_alias=AliasChoices("CUDA_VISIBLE_DEVICES", "cuda_visible_devices"),
        description="(CUDA's own variable) the GPUs this process may use; engine hosts are "
        "pinned to one each",
    )
    tinker_session_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A Tinker session that sends nothing for this long (the SDK heartbeats "
        "every 10 s) is settled as lost: its script died; its models are freed",
    )
    tinker_poll_hold_s: float = Field(
        25.0,
        gt=0,
        le=40,
        description="How long retrieve_future holds a poll for a result before answering "
        "try_again (the SDK gives up on a poll after 45 s)",
    )
    tinker_future_ttl_s: float = Field(
        900.0, gt=0, description="How long a finished request's result waits for its client"
    )
    tinker_max_body_bytes: int = Field(
        32 << 20,
        ge=1 << 20,
        description="Larger /api/v1 bodies get 413; the SDK is told to cut forward_backward "
        "requests to a quarter of it",
    )
    engine_host_module: str = Field(
        "runners.engine_host",
        description="python -m <this>: the engine host, the one process per var/ folder that "
        "holds the models for runs, the Tinker API and inference",
    )
    run_engine: Literal["shared", "private"] = Field(
        "shared",
        description="Where a local run's model lives unless its config says (engine): shared, "
        "the engine host; private, the run's own process",
    )
    runner_torch: bool = Field(
        False,
        description="A run's process imports torch even where its model is elsewhere (the "
        "engine host, hosted Tinker); the runner sets it itself when its environment's file "
        "imports torch",
    )
    engine_group_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="What a run's host group (num_devices above 1) sums its gradients over: "
        "auto = NCCL where each of its hosts has a GPU of its own, else gloo (on the CPU, and "
        "for hosts sharing a GPU, which NCCL refuses)",
    )
    engine_admission_wait_s: float = Field(
        600.0,
        ge=0,
        description="A run whose base model the engine host's memory budget cannot take yet "
        "waits this long for room (its details say what is loaded), then fails with the reason",
    )
    engine_client_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A client of the engine host (a run, the server) that sends nothing for "
        "this long (they beat every 5 s) is released: its models and samplers go",
    )
    engine_idle_s: float = Field(
        600.0,
        gt=0,
        description="The engine host exits after this long with no client connected",
    )

    # Inference worker.
    inference_timeout_s: float = Field(
        120.0, gt=0, description="Hard deadline of one test-inference request (worker restarted)"
    )
    inference_budget_s: float = Field(
        24.0,
        gt=0,
        description="Time a test-inference answer may take; unfinished responses are returned "
        "cut short, saying so (under the 30 s timeout of typical agent clients)",
    )
    inference_warmup: bool = Field(
        True, description="Load the default model into the inference worker at start-up"
    )
    inference_max_prompts: int = Field(64, ge=1)

    # Environment inspection.
    inspect_timeout_s: float = Field(
        20.0, gt=0, description="Most seconds importing an environment file may take"
    )

    # Atropos environments (docs/atropos.md): they run in an interpreter of their own.
    atropos_python: str = Field(
        str(PROJECT_ROOT / ".venv-atropos" / "bin" / "python"),
        description="The Python with atroposlib 0.4 that Atropos environments, their "
        "inspector and the trajectory API run in (`make install` makes .venv-atropos)",
    )
    atropos_start_timeout_s: float = Field(
        180.0,
        gt=0,
        description="Most seconds an Atropos environment may take from its start to its first "
        "request for a completion, and the trajectory API to answer",
    )
    atropos_stall_s: float = Field(
        600.0,
        gt=0,
        description="An Atropos run whose environment sends no usable batch for this long "
        "fails, saying why from the environment's log (it says it is stalled sooner)",
    )

    # verifiers environments (docs/verifiers.md): an interpreter of their own too.
    verifiers_python: str = Field(
        str(PROJECT_ROOT / ".venv-verifiers" / "bin" / "python"),
        description="The Python with verifiers 0.3 that verifiers environments, their "
        "inspector and a run's driver run in (`make install` makes .venv-verifiers)",
    )
    verifiers_start_timeout_s: float = Field(
        180.0,
        gt=0,
        description="Most seconds a verifiers environment may take to load in a run",
    )
    verifiers_install_timeout_s: float = Field(
        900.0,
        gt=0,
        description="Most seconds the installation of a verifiers environment's own "
        "dependencies (its pyproject.toml's) may take before it counts as failed",
    )

    # Prices (docs/runs.md, "What a run cost"): money from what a run spent, on read.
    price_device_hour: float | None = Field(
        None,
        description="What one hour of the device a local run holds costs (a GPU's hourly "
        "price, or the CPU machine's), in RLCS_PRICE_CURRENCY",
    )
    price_per_mtok_prefill: float | None = Field(
        None, description="What a million prompt tokens prefilled for sampling cost"
    )
    price_per_mtok_sampled: float | None = Field(
        None, description="What a million tokens sampled (generated) cost"
    )
    price_per_mtok_trained: float | None = Field(
        None, description="What a million tokens trained on (forward and backward) cost"
    )
    price_currency: str = Field(
        "USD", description="The currency of the RLCS_PRICE_* settings (an ISO 4217 code)"
    )
    tinker_prices: Path | None = Field(
        None,
        description="Hosted Tinker's prices per model (a TOML file; default: the table shipped "
        "in server/runs/tinker_prices.toml), for runs trained on hosted Tinker",
    )

    # Metrics from W&B.
    wandb_cache_s: float = Field(5.0, ge=0.0)
    wandb_timeout_s: float = Field(3.0, gt=0.0)

    # Service keys (no prefix): they reach a runner only through its environment.
    tinker_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("TINKER_API_KEY", "RLCS_TINKER_API_KEY")
    )
    tinker_base_url: str | None = Field(
        None, validation_alias=AliasChoices("TINKER_BASE_URL", "RLCS_TINKER_BASE_URL")
    )
    wandb_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("WANDB_API_KEY", "RLCS_WANDB_API_KEY")
    )
    wandb_base_url: str | None = Field(
        None, validation_alias=AliasChoices("WANDB_BASE_URL", "RLCS_WANDB_BASE_URL")
    )
    wandb_entity: str | None = Field(
        None, validation_alias=AliasChoices("WANDB_ENTITY", "RLCS_WANDB_ENTITY")
    )
    openreward_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENREWARD_API_KEY", "RLCS_OPENREWARD_API_KEY")
    )

    @field_validator("database_url")
    @classmethod
    def _a_database_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        # Imported only for a URL to check. A process installed without the database layer (an
        # engine host or a run's process on a bare GPU image) opens no database: nothing to check.
        try:
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError
        except ImportError:
            return value

        try:
            make_url(value)
        except ArgumentError:
            raise ValueError(
                "RLCS_DATABASE_URL is not a database URL; use sqlite:////path/to/rlcs.db or "
                "postgresql+psycopg://user:password@host:5432/dbname"
            ) from None
        return value

    @field_validator(
        "price_device_hour",
        "price_per_mtok_prefill",
        "price_per_mtok_sampled",
        "price_per_mtok_trained",
        mode="before",
    )
    @classmethod
    def _a_price(cls, value: object, info: ValidationInfo) -> object:
        """A price: a finite number of at least 0; unset or empty, no price."""
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        name = f"RLCS_{(info.field_name or '').upper()}"
        try:
            price = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            price = math.nan
        if not math.isfinite(price) or price < 0:
            raise ValueError(
                f"{name} must be a number of at least 0 (e.g. 2.5), not {value!r}; unset it "
                "for no price"
            )
        return price

    @field_validator("price_currency")
    @classmethod
    def _a_currency(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", value):
            raise ValueError(
                f"RLCS_PRICE_CURRENCY must be a three-letter currency code (USD, EUR), "
                f"not {value!r}"
            )
        return value

    @field_validator("allowed_hosts", "cors_origins", "webhook_allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("env_dirs", mode="before")
    @classmethod
    def _folders(cls, value: object) -> object:
        """RLCS_ENV_DIRS=/a/folder, /a:/b (as PATH and PYTHONPATH are written) or '["/a"]'."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except ValueError:
                raise ValueError(
                    "RLCS_ENV_DIRS is not a JSON list; write folders joined by ':' "
                    '(/a/envs:/b/envs) or a JSON list (["/a/envs"])'
                ) from None
        return [part for part in text.split(os.pathsep) if part.strip()]

    @model_validator(mode="after")
    def _read_tokens_need_an_admin_token(self) -> Settings:
        if self.read_tokens is not None and self.api_token is None:
            raise ValueError(
                "RLCS_READ_TOKENS is set without RLCS_API_TOKEN: a server with no admin token "
                "takes no tokens at all; set RLCS_API_TOKEN too, or unset RLCS_READ_TOKENS"
            )
        return self

    @property
    def concurrent_runs(self) -> int:
        """RLCS_MAX_CONCURRENT_RUNS, or its default for where runs keep their models."""
        if self.max_concurrent_runs is not None:
            return self.max_concurrent_runs
        return 8 if self.run_engine == "shared" else 2

    @cached_property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.var_dir / 'rlcs.db'}"

    @property
    def runs_dir(self) -> Path:
        return self.checkpoint_dir or self.var_dir / "runs"

    @property
    def export_root(self) -> Path:
        return self.export_path or self.var_dir / "exports"

    @property
    def models_dir(self) -> Path:
        return self.models_path or self.var_dir / "models"

    @property
    def environment_dirs(self) -> list[Path]:
        return [PROJECT_ROOT / "environments", *self.env_dirs]

    @property
    def read_token_values(self) -> list[str]:
        raw = self.read_tokens.get_secret_value() if self.read_tokens else ""
        return [part.strip() for part in raw.split(",") if part.strip()]

    def host_allowlist(self) -> frozenset[str] | None:
        """Host names a request may name (lower case, no port), or None for any.

        The default guards the tokenless loopback server against DNS rebinding; a server
        that takes a token (or was opened to all) has no default list: a page without the
        token gets nothing from it anyway."""
        if self.allowed_hosts:
            names = {h.lower().rstrip(".").strip("[]") for h in self.allowed_hosts}
            return None if "*" in names else frozenset(names)
        if self.api_token is not None or self.insecure_no_token:
            return None
        names = {"localhost", "127.0.0.1", "::1"}
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host.lower().strip("[]"))
        return frozenset(names)

    @property
    def default_backend(self) -> Literal["local", "tinker"]:
        return "tinker" if self.tinker_api_key else "local"

    def check_bind(self) -> None:
        """Refuse to listen beyond loopback without a token (DESIGN §10); requests from other
        machines are refused anyway (server.guards.access), this says so before serving."""
        if not is_loopback(self.host) and self.api_token is None and not self.insecure_no_token:
            raise SystemExit(
                f"Refusing to listen on {self.host} without a token: set RLCS_API_TOKEN, "
                "or bind RLCS_HOST=127.0.0.1 (RLCS_INSECURE_NO_TOKEN=1 overrides this)."
            )

    def child_environment(self) -> dict[str, str]:
        """The environment of a runner or worker: ours, these settings, the keys (no others)."""
        env = {k: v for k, v in os.environ.items() if k not in _SECRET_NAMES}
        env.update(self.runner_variables())
        return env

    def runner_variables(
        self, run_spec: str | None = None, resume_point: str | None = None
    ) -> dict[str, str]:
        """What a runner needs to know, wherever it runs: these settings and the service keys
        (a Ray job gets exactly these, on top of its node's own environment, with the run's
        spec and resume point that `run_spec` and `resume_point` read back)."""
        env = {
            "RLCS_VAR_DIR": str(self.var_dir),
            "RLCS_DATABASE_URL": self.db_url,
            **self._engine_variables(),
            "RLCS_MODELS_DIR": str(self.models_dir),
            "RLCS_BACKEND_CALL_TIMEOUT_S": str(self.backend_call_timeout_s),
            "RLCS_TINKER_CREATE_TIMEOUT_S": str(self.tinker_create_timeout_s),
            "RLCS_ATROPOS_PYTHON": self.atropos_python,
            "RLCS_ATROPOS_START_TIMEOUT_S": str(self.atropos_start_timeout_s),
            "RLCS_ATROPOS_STALL_S": str(self.atropos_stall_s),
            "RLCS_VERIFIERS_PYTHON": self.verifiers_python,
            "RLCS_VERIFIERS_START_TIMEOUT_S": str(self.verifiers_start_timeout_s),
            "PYTHONUNBUFFERED": "1",
            "TINKER_TELEMETRY": os.environ.get("TINKER_TELEMETRY", "0"),
            "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
        }
        env.update(self._optional_variables())
        if run_spec is not None:
            env["RLCS_RUN_SPEC"] = run_spec
        if resume_point is not None:
            env["RLCS_RESUME_POINT"] = resume_point
        env.update(self.secret_env())
        return env

    def _engine_variables(self) -> dict[str, str]:
        """How a runner's engine places, sizes and serves what it trains and samples."""
        return {
            "RLCS_DEVICE": self.device,
            "RLCS_DTYPE": self.dtype,
            "RLCS_SAMPLING_DTYPE": self.sampling_dtype,
            "RLCS_ADAPTER_SLOTS": str(self.adapter_slots),
            "RLCS_MAX_LORA_RANK": str(self.max_lora_rank),
            "RLCS_CPU_ADAPTER_KERNEL": str(self.cpu_adapter_kernel).lower(),
            "RLCS_CAST_LM_HEAD_TO_FP32": str(self.cast_lm_head_to_fp32).lower(),
            "RLCS_TRAINING_LANES": str(self.training_lanes),
            "RLCS_ENGINE_HOST_MODULE": self.engine_host_module,
            "RLCS_RUN_ENGINE": self.run_engine,
            "RLCS_ENGINE_CLIENT_TIMEOUT_S": str(self.engine_client_timeout_s),
            "RLCS_ENGINE_ADMISSION_WAIT_S": str(self.engine_admission_wait_s),
            "RLCS_ENGINE_IDLE_S": str(self.engine_idle_s),
            "RLCS_ENGINE_GROUP_BACKEND": self.engine_group_backend,
        }

    def _optional_variables(self) -> dict[str, str]:
        """The settings a runner is told only when they are set."""
        optional: dict[str, str] = {}
        if self.tokens_per_microbatch is not None:
            optional["RLCS_TOKENS_PER_MICROBATCH"] = str(self.tokens_per_microbatch)
        if self.engine_hosts is not None:
            optional["RLCS_ENGINE_HOSTS"] = self.engine_hosts
        if self.engine_memory_budget_gb is not None:
            optional["RLCS_ENGINE_MEMORY_BUDGET_GB"] = str(self.engine_memory_budget_gb)
        if self.tinker_base_url:
            optional["TINKER_BASE_URL"] = self.tinker_base_url
        if self.wandb_base_url:
            optional["WANDB_BASE_URL"] = self.wandb_base_url
        if self.wandb_entity:
            optional["WANDB_ENTITY"] = self.wandb_entity
        return optional

    def inspector_environment(self) -> dict[str, str]:
        """An inspector runs environment code to read its Config: no service keys, no token."""
        env = {k: v for k, v in os.environ.items() if k not in _SECRET_NAMES}
        env.update({"PYTHONUNBUFFERED": "1", "OPENREWARD_DISABLE_UPDATE_CHECK": "1"})
        return env

    def secret_env(self) -> dict[str, str]:
        """The service keys, as environment variables for a child process (never persisted)."""
        pairs = {
            "TINKER_API_KEY": self.tinker_api_key,
            "WANDB_API_KEY": self.wandb_api_key,
            "OPENREWARD_API_KEY": self.openreward_api_key,
        }
        return {k: v.get_secret_value() for k, v in pairs.items() if v is not None}


_SECRET_NAMES = frozenset(
    {
        "TINKER_API_KEY",
        "WANDB_API_KEY",
        "OPENREWARD_API_KEY",
        "RLCS_API_TOKEN",
        "RLCS_WEBHOOK_SIGNING_KEY",
        "RLCS_TINKER_API_KEY",
        "RLCS_WANDB_API_KEY",
        "RLCS_OPENREWARD_API_KEY",
    }
)
