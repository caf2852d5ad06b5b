"""The training half of every run's config: model, LoRA, optimizer, loss, sampling, W&B and
resources. An environment's config includes it (`environments.base.EnvConfig`); the runner
reads these fields, the environment never needs to."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from core import checkpoint_refs, loss_config
from core.model_names import LOCAL_DEFAULT_MODEL


def _offer_usable_losses(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """The schema's `loss_fn` choices: the RL losses, less those that read recorded sequences
    where this config's runs carry no sequence ids (another framework's environments)."""
    field = schema.get("properties", {}).get("loss_fn")
    if field is not None:
        field["enum"] = list(loss_config.usable_losses(getattr(cls, "SEQUENCE_IDS", True)))


class TrainingConfig(BaseModel):
    """How a run trains, whatever it trains on."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        json_schema_extra=_offer_usable_losses,
    )

    # Fields decided by the server: shown to the user, never edited (see `locked_fields`).
    LOCKED: ClassVar[frozenset[str]] = frozenset({"tokenizer_name"})
    # Whether the run's driver knows the sampler's id of each sequence it trains (a loss that
    # `reads_recorded` needs them); False where another framework's environment samples
    # through the inference face.
    SEQUENCE_IDS: ClassVar[bool] = True

    # Checkpoints.
    save_every: int = Field(
        5, ge=0, le=1_000_000, description="Steps between checkpoints (0 = only at the end)"
    )
    # Rollouts: what each step's episodes said, kept to read (core/rollouts.py). None: the
    # default, so a run frozen before these fields existed resumes with the same config hash.
    rollouts_per_step: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="Episodes of each step kept to read (default 256: all up to that, beyond "
        "it the best, the worst and a seeded random sample; 0 = none)",
    )
    rollouts_max_mb: float | None = Field(
        None,
        gt=0,
        le=100_000,
        description="Size cap of a run's kept episodes in MB (default 64); past it older steps "
        "are thinned first",
    )
    # Logging.
    use_wandb: bool = Field(True, description="Log to Weights & Biases (offline without a key)")
    wandb_project: str = Field("rl-training", min_length=1, max_length=128)
    wandb_name: str | None = Field(None, max_length=128, description="W&B run name prefix")
    # Model and backend.
    # The class default; the server puts the backend's own default in when a config names none.
    model_name: str = Field(LOCAL_DEFAULT_MODEL, min_length=1, max_length=256)
    tokenizer_name: str = Field(LOCAL_DEFAULT_MODEL, description="Derived from model_name")
    backend: Literal["auto", "local", "tinker"] = Field(
        "auto", description="auto = tinker when TINKER_API_KEY is set, else local"
    )
    engine: Literal["auto", "shared", "private"] = Field(
        "auto",
        description="Where a local run's model lives: shared = the machine's engine host (one "
        "copy of each base for every run, decoding in shared batches); private = a copy in "
        "the run's own process; auto = RLCS_RUN_ENGINE (shared)",
    )
    # Resources a run asks of a Ray cluster (RLCS_LAUNCHER=ray); ignored by local runs.
    num_gpus: float | None = Field(
        None,
        ge=0,
        le=64,
        description="GPUs for the run's Ray job (default: 1 for a local backend on CUDA, else 0)",
    )
    num_cpus: float | None = Field(
        None, ge=0, le=1024, description="CPUs for the run's Ray job (default: 1)"
    )
    # Optimisation.
    lora_rank: int = Field(32, ge=1, le=512)
    learning_rate: float = Field(4e-5, gt=0, le=1.0)
    # The choices are core/loss_config.py's; the schema lists those this config's runs can use
    # (_offer_usable_losses), for the dashboard's select.
    loss_fn: str = "importance_sampling"
    loss_fn_config: dict[str, float] = Field(
        default_factory=dict, description="e.g. clip_low_threshold/clip_high_threshold or beta"
    )
    rollout_correction: Literal["token", "none"] | None = Field(
        None,
        description="For importance_sampling on the local engine, what bounds the ratio of "
        "trainer to sampler: token (the default): each token's ratio truncated at 2 (token "
        "TIS) and tokens outside [1/8, 8] masked, verl's rollout_is and rollout_rs; none: "
        "Tinker's objective as is. loss_fn_config's rollout_* keys set other thresholds",
    )
    advantage: Literal["grpo", "rebn"] = Field(
        "grpo", description="grpo: group-relative; rebn: discounted returns, batch-normalised"
    )
    scale_advantage_by_std: bool = Field(False, description="grpo: divide by the group's std")
    gamma: float = Field(0.9, ge=0.0, le=1.0, description="Discount for rebn returns")
    # Off-policy sampling, a KL penalty, distillation (docs/runs.md, "Algorithms"). Unset (None)
    # is each one's default, so a run frozen before these fields existed resumes with the same
    # config hash.
    max_steps_off_policy: int | None = Field(
        None,
        ge=0,
        le=64,
        description="How many steps sampling may run ahead of training (default 0: sample a "
        "batch, then train on it); groups sampled more steps before are not trained on",
    )
    kl_penalty_coef: float | None = Field(
        None,
        ge=0.0,
        le=100.0,
        description="Weight of a per-token KL penalty to kl_reference, folded into the "
        "advantages as tinker-cookbook does (default 0: none)",
    )
    kl_reference: str | None = Field(
        None,
        max_length=64,
        description="What the KL penalty measures against: base (the base model, the default) "
        f"or a run's sampler checkpoint, {checkpoint_refs.FORMS}; named with no penalty, the "
        "KL is measured (kl/reference) but not penalised",
    )
    teacher: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="On-policy distillation: a model name, or a run's sampler checkpoint "
        f"({checkpoint_refs.FORMS}), that scores the run's own samples token by token; its "
        "per-token reverse KL is a negative advantage",
    )
    teacher_kl_coef: float | None = Field(
        None,
        ge=0.0,
        le=100.0,
        description="Weight of the teacher's per-token reverse KL in the advantages (default 1)",
    )
    reward_coef: float | None = Field(
        None,
        ge=0.0,
        le=100.0,
        description="Weight of the environment reward's advantage (default 1; 0 with a teacher: "
        "pure distillation on the environment's prompts)",
    )
    # Sampling the policy.
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=1_000_000)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    resume_from: str | None = Field(None, description="A state checkpoint path to start from")
    # Several engine hosts for one local run on the shared engine (issue 55).
    sample_hosts: Annotated[int, Field(ge=1, le=64)] | Literal["all"] = Field(
        1,
        description="Engine hosts a local run samples on (rollout data parallel): 1, a number, "
        "or all (every host of the machine); its trainer stays on the first, and its weights "
        "reach the others after each step",
    )
    num_devices: int = Field(
        1,
        ge=1,
        le=64,
        description="Engine hosts a local run trains on as one group: each step's datums split "
        "over them, their LoRA gradients summed before every optimizer step",
    )

    @field_validator("loss_fn")
    @classmethod
    def _usable_loss(cls, value: str) -> str:
        choices = loss_config.RL_LOSSES
        if value not in choices:
            # Worded as pydantic words a Literal's refusal (this field was one), for clients.
            listed = [repr(name) for name in choices]
            expected = f"{', '.join(listed[:-1])} or {listed[-1]}"
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": expected}
            )
        if loss_config.LOSSES[value].reads_recorded and not cls.SEQUENCE_IDS:
            usable = loss_config.usable_losses(sequence_ids=False)
            raise ValueError(
                f"{value} reads the sampler's logprobs from the sequences it recorded, by their "
                "ids, and this environment's rollouts carry no sequence ids (it samples through "
                f"the inference face); choose one of {', '.join(usable)} (gspo and ppo are "
                "clipped, stable off-policy)"
            )
        return value

    @field_validator("loss_fn_config")
    @classmethod
    def _known_loss_keys(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        # Checked here, at POST /runs, rather than by the backend after the model loaded.
        loss_fn = info.data.get("loss_fn")
        if loss_fn is not None:
            loss_config.resolve(loss_fn, value)
        return value

    @field_validator("kl_reference")
    @classmethod
    def _reference_form(cls, value: str | None) -> str | None:
        if value is not None and value != checkpoint_refs.BASE:
            if checkpoint_refs.parse(value) is None:
                raise ValueError(
                    f"{value!r} is neither 'base' (the base model) nor a run's sampler "
                    f"checkpoint ({checkpoint_refs.FORMS})"
                )
        return value

    @field_validator("reward_coef")
    @classmethod
    def _something_to_learn(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value == 0 and info.data.get("teacher") is None:
            raise ValueError(
                "0 leaves nothing to learn from without a teacher: set teacher (on-policy "
                "distillation), or leave reward_coef out"
            )
        return value

    @field_validator("sample_hosts")
    @classmethod
    def _samples_recorded_where_trained(cls, value: int | str, info: ValidationInfo) -> int | str:
        loss_fn = info.data.get("loss_fn")
        if value != 1 and loss_fn and loss_config.LOSSES[loss_fn].reads_recorded:
            raise ValueError(
                f"{loss_fn} reads the sequences its trainer's host recorded as it sampled them, "
                "so its run samples on that host alone: use sample_hosts 1, or another loss"
            )
        return value

    @model_validator(mode="after")
    def _derive_locked(self) -> TrainingConfig:
        # The tokenizer always follows the model; bypass validate_assignment to avoid recursion.
        if self.tokenizer_name != self.model_name:
            object.__setattr__(self, "tokenizer_name", self.model_name)
        return self

    @classmethod
    def locked_fields(cls) -> frozenset[str]:
        return cls.LOCKED
