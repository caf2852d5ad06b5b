"""The models that score a run's own samples besides its policy (docs/runs.md, "Algorithms"): the
KL penalty's reference (`kl_reference`: the base model, or a run's checkpoint) and the
distillation teacher (`teacher`: a model name, or a run's checkpoint). Each gives its logprob of
every token of a sequence (`compute_logprobs`), which the learner folds into the advantages.

On the local backend the base model is the policy's own loaded weights with no adapter (no second
copy); a checkpoint on the same base model, whatever its LoRA shape, is one more adapter in the
sampler's slots beside the policy's (scored in the same decode thread, never under the trainer's
lock); another model is loaded beside them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select
from tinker import types

from core import checkpoint_refs
from core.db import read_session
from core.failures import RunFailure
from core.models import Checkpoint
from core.training_config import TrainingConfig
from runners.episodes.policy import bounded
from runners.train.learner import Sequence, fold_kl_penalty, fold_teacher, scale_advantages

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from runners.backends.surface import SamplingClient

log = logging.getLogger("runner")


class ScorerUnusable(RunFailure):
    """A teacher or KL reference that cannot score this run's tokens (says why)."""

    category = "model"


@dataclass
class Scorers:
    """What a run folds into its advantages besides the environment's reward."""

    reward_coef: float = 1.0
    reference: SamplingClient | None = None
    kl_coef: float = 0.0
    teacher: SamplingClient | None = None
    teacher_coef: float = 1.0
    timeout_s: float | None = None

    @property
    def keeps_flat_groups(self) -> bool:
        """A teacher teaches every sampled token: groups whose rewards are equal stay."""
        return self.teacher is not None

    async def fold(self, sequences: list[Sequence]) -> dict[str, float]:
        """The signals folded into `sequences`' advantages (in place); their metrics."""
        metrics: dict[str, float] = {}
        if not sequences:
            return metrics
        if self.reward_coef != 1.0:
            scale_advantages(sequences, self.reward_coef)
        if self.reference is not None:
            logprobs = await self._logprobs(self.reference, sequences, "KL reference")
            kl = fold_kl_penalty(sequences, logprobs, self.kl_coef)
            if kl is not None:
                metrics["kl/reference"] = kl
        if self.teacher is not None:
            logprobs = await self._logprobs(self.teacher, sequences, "teacher")
            reverse_kl = fold_teacher(sequences, logprobs, self.teacher_coef)
            if reverse_kl is not None:
                metrics["teacher/reverse_kl"] = reverse_kl
        return metrics

    async def _logprobs(
        self, client: SamplingClient, sequences: list[Sequence], what: str
    ) -> list[list[float]]:
        """Each token's logprob under `client` given the ones before it (0 for the first)."""
        answers = await asyncio.gather(
            *(
                bounded(
                    client.compute_logprobs(types.ModelInput.from_ints(s.tokens)),
                    self.timeout_s,
                    f"{what} compute_logprobs",
                )
                for s in sequences
            )
        )
        return [[0.0 if v is None else float(v) for v in values] for values in answers]


async def open_scorers(
    config: TrainingConfig,
    service: Any,
    training: Any,
    engine: Engine,
    timeout_s: float | None,
) -> Scorers | None:
    """The run's scorers, or None when it folds in nothing (no KL penalty, no teacher, the
    reward at weight 1). A `kl_reference` named with no penalty is measured (kl/reference),
    not penalised."""
    kl_coef = config.kl_penalty_coef or 0.0
    reward_coef = 1.0 if config.reward_coef is None else config.reward_coef
    measured = bool(kl_coef) or config.kl_reference is not None
    if not measured and config.teacher is None and reward_coef == 1.0:
        return None
    scorers = Scorers(
        reward_coef=reward_coef,
        kl_coef=kl_coef,
        teacher_coef=1.0 if config.teacher_kl_coef is None else config.teacher_kl_coef,
        timeout_s=timeout_s,
    )
    if measured:
        reference = config.kl_reference or checkpoint_refs.BASE
        scorers.reference = await _client(config, service, training, engine, reference, timeout_s)
        log.info("KL to %s measured, penalty weight %g", reference, kl_coef)
    if config.teacher is not None:
        teacher = await _client(config, service, training, engine, config.teacher, timeout_s)
        if hasattr(training, "create_base_sampling_client"):  # local: tokenizers at hand
            _check_tokenizer(training, teacher, config.teacher)
        scorers.teacher = teacher
        log.info(
            "teacher %s (reverse KL weight %g, reward weight %g)",
            config.teacher,
            scorers.teacher_coef,
            reward_coef,
        )
    return scorers


async def _client(
    config: TrainingConfig,
    service: Any,
    training: Any,
    engine: Engine,
    name: str,
    timeout_s: float | None,
) -> SamplingClient:
    """A sampling client of `name`: `base` or the run's own model (on the local backend its
    loaded weights, adapter off), a run's checkpoint, or another model by name."""
    if name in (checkpoint_refs.BASE, config.model_name):
        own = getattr(training, "create_base_sampling_client", None)
        if own is not None:
            client: SamplingClient = own()
            return client
        return await bounded(
            service.create_sampling_client(base_model=config.model_name),
            timeout_s,
            f"sampling client of {config.model_name}",
        )
    if checkpoint_refs.parse(name) is not None:
        path = sampler_path(engine, name)
        return await bounded(
            service.create_sampling_client(model_path=path), timeout_s, f"sampling client of {name}"
        )
    return await bounded(
        service.create_sampling_client(base_model=name), timeout_s, f"sampling client of {name}"
    )


def sampler_path(engine: Engine, reference: str) -> str:
    """The path of the sampler checkpoint a (pinned) run reference names."""
    parsed = checkpoint_refs.parse(reference)
    assert parsed is not None
    run_id, step = parsed
    with read_session(engine) as session:
        rows = session.exec(
            select(Checkpoint)
            .where(Checkpoint.run_id == run_id, Checkpoint.kind == "sampler")
            .order_by(col(Checkpoint.step).desc(), col(Checkpoint.id).desc())
        ).all()
    for row in rows:
        if step is None or row.step == step:
            return row.path
    raise ScorerUnusable(
        f"{reference}: run {run_id} has no such sampler checkpoint any more (it was checked "
        "when this run was made); name another checkpoint, then start the run again"
    )


def _check_tokenizer(training: Any, teacher: Any, name: str) -> None:
    """A teacher scores the student's token ids: its vocabulary must be the student's."""
    mine, theirs = training.get_tokenizer(), teacher.get_tokenizer()
    if mine is theirs:
        return
    if mine.get_vocab() != theirs.get_vocab():
        raise ScorerUnusable(
            f"teacher {name} has another tokenizer than the student's model: it scores the "
            "student's token ids, so it must share its vocabulary (a model of the same family)"
        )
