"""Adapter for reasoning-gym: any procedural dataset as single-turn tasks answered in \\boxed{}.
The answer format (an instruction appended to each question, the last box read) is ours."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from environments.base import EnvConfig, SingleTurnEnv, Split, StepResult, Task, Unscorable
from environments.support import rg_catalog
from environments.support.answers import last_boxed
from environments.support.pkgsrc import require
from environments.support.quiet_import import import_quietly

# Cheap (finds, does not import): a missing extra shows as "not importable" in the listing.
require("reasoning_gym", "reasoning-gym")

INSTRUCTION = "\n\nPut your final answer within \\boxed{}."
# Free prompts are matched against at most this many items per split (built once, cached).
INDEX_LIMIT = 5000


class ReasoningGymConfig(EnvConfig):
    dataset: str = Field("leg_counting", max_length=200, description="A reasoning-gym dataset name")
    dataset_config: dict[str, Any] = Field(
        default_factory=dict,
        description="The dataset's own settings (rg.create_dataset keywords), e.g. difficulty",
    )
    size: int = Field(500, ge=1, le=1_000_000, description="Items per split; task = seed % size")
    dataset_seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed of the training items")
    eval_dataset_seed: int | None = Field(
        None, ge=0, le=2**31 - 1, description="Seed of the held-out items (default seed + 1)"
    )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        rg_catalog.check_dataset(value)
        return value

    # Field validators (not a model validator) so that an error names its field.
    @field_validator("dataset_config")
    @classmethod
    def _known_keys(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "dataset" in info.data:
            rg_catalog.check_dataset_config(info.data["dataset"], value)
        return value

    @field_validator("eval_dataset_seed")
    @classmethod
    def _held_out(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value == info.data.get("dataset_seed"):
            raise ValueError("eval_dataset_seed must differ from dataset_seed (held-out items)")
        return value

    @property
    def eval_seed(self) -> int:
        return (
            self.eval_dataset_seed
            if self.eval_dataset_seed is not None
            else (self.dataset_seed + 1)
        )


class ReasoningGymEnv(SingleTurnEnv):
    """reasoning-gym tasks (any of its ~100 procedural datasets), answered in \\boxed{}."""

    name = "reasoning_gym"
    Config = ReasoningGymConfig
    config: ReasoningGymConfig

    def get_task(self, seed: int, split: Split = "train") -> Task:
        dataset = self._dataset(split)
        index = seed % self.config.size
        entry = dataset[index]
        return Task(
            prompt=str(entry["question"]) + INSTRUCTION,
            answer=entry,
            metadata={"split": split, "index": index, "dataset": self.config.dataset},
        )

    def score(self, prompt: str, response: str, task: Task | None = None) -> float:
        return self._judge(prompt, response, task)[0]

    async def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        reward, metrics = self._judge(self._task.prompt, action, self._task)
        return StepResult(observation="", reward=reward, done=True, metrics=metrics)

    def _judge(self, prompt: str, response: str, task: Task | None) -> tuple[float, dict]:
        """The score in [0, 1] and what went wrong, if anything."""
        if task is None:
            task = self._find(prompt)
        answer = last_boxed(response)
        if answer is None:
            return 0.0, {"no_answer": 1.0, "score_error": 0.0}
        dataset = self._dataset(task.metadata.get("split", "train"))
        try:
            score = float(dataset.score_answer(answer, task.answer))
        except Exception:  # verifiers raise on unparsable answers (prime_factorization does)
            return 0.0, {"no_answer": 0.0, "score_error": 1.0}
        return min(1.0, max(0.0, score)), {"no_answer": 0.0, "score_error": 0.0}

    def _find(self, prompt: str) -> Task:
        """The item of this dataset (either split) whose question is `prompt`."""
        question = prompt.strip()
        if question.endswith(INSTRUCTION.strip()):
            question = question[: -len(INSTRUCTION.strip())].strip()
        for split in ("train", "eval"):
            index = _question_index(self._key(split)).get(question)
            if index is not None:
                return self.get_task(index, split)
        raise Unscorable(
            f"the prompt is not a question of reasoning-gym dataset {self.config.dataset!r} "
            f"as configured (seeds {self.config.dataset_seed}/{self.config.eval_seed}, first "
            f"{min(self.config.size, INDEX_LIMIT)} items); only its own questions can be scored"
        )

    def _dataset(self, split: str) -> Any:
        return _build(self._key(split))

    def _key(self, split: str) -> tuple[str, str, int, int]:
        cfg = self.config
        seed = cfg.eval_seed if split == "eval" else cfg.dataset_seed
        return (cfg.dataset, json.dumps(cfg.dataset_config, sort_keys=True), cfg.size, seed)


@lru_cache(maxsize=16)
def _build(key: tuple[str, str, int, int]) -> Any:
    """One dataset object per settings; items are generated on access, deterministically."""
    name, config_json, size, seed = key
    rg = import_quietly("reasoning_gym")
    return rg.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


@lru_cache(maxsize=8)
def _question_index(key: tuple[str, str, int, int]) -> dict[str, int]:
    dataset = _build(key)
    index: dict[str, int] = {}
    for i in range(min(key[2], INDEX_LIMIT)):
        index.setdefault(str(dataset[i]["question"]).strip(), i)
    return index
