"""Test inference on an Atropos environment, in the inference worker (POST /test/inference).

`num_items`: the environment runs its own items in its `process` mode (`<atropos python> FILE
process --config YAML`, in its folder) against a short-lived inference face serving the base
model or a run's checkpoint; it scores them itself, and writes the scored groups (with their
messages) to a file read back here. `process` retries an item whose group scores to None for
ever, so it runs within the request's time budget and what it scored by then is the answer.

Free `prompts`: the model answers each through its chat template. An Atropos environment
scores only items it made itself (get_next_item gives what its scoring checks), so these come
back unscored, saying so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from core.atropos import AtroposRunConfig, atropos_environment
from core.process import Process, start_logged
from core.settings import Settings
from core.spec import InferenceJob
from runners.atropos.env_yaml import server_entries
from runners.atropos.watch import LogWatch
from runners.doors.face import InferenceFace, serving
from runners.doors.free_prompts import answer_prompts
from runners.doors.requests import SamplingDefaults
from runners.episodes.render import Renderer
from runners.models.loading import tokenizer_folder

UNSCORED = (
    "an Atropos environment scores only the items it makes itself (its get_next_item gives "
    "what its scoring checks); ask for num_items to have it play and score its own"
)
STARTUP_MARGIN_S = 1.0  # the process is stopped this long before the budget ends


class AtroposInference:
    def __init__(
        self,
        settings: Settings,
        job: InferenceJob,
        sampler: Any,
        tokenizer: Any,
        context: int | None,
    ) -> None:
        self.settings = settings
        self.job = job
        self.config = AtroposRunConfig.model_validate(job.source.config)
        self.sampler = sampler
        self.tokenizer = tokenizer
        # The tokenizer's folder, by name: the environment's own process loads it again.
        self.tokenizer_dir = tokenizer_folder(job.model, settings.models_dir)
        self.context = context
        self.end_ids = Renderer(tokenizer, "plain").stop_token_ids()

    async def run(self, deadline: float | None) -> list[dict[str, Any]]:
        """`deadline`: time.monotonic() by which the answer is due (a request without one
        gets the hard inference deadline: process mode may otherwise never end)."""
        if deadline is None:
            deadline = time.monotonic() + self.settings.inference_timeout_s
        if self.job.prompts:
            cfg = self.config
            return await answer_prompts(
                self.job, self.sampler, self.tokenizer, cfg.top_p, cfg.top_k, UNSCORED
            )
        return await self._own_items(deadline)

    # The environment's own items -----------------------------------------------------------

    async def _own_items(self, deadline: float | None) -> list[dict[str, Any]]:
        job = self.job
        face = self._face()
        face.set_sampler(self.sampler)
        work = self.settings.var_dir / "inference" / "atropos" / uuid.uuid4().hex[:12]
        work.mkdir(parents=True, exist_ok=True)
        try:
            async with serving(face) as url:
                groups_file = work / "groups.jsonl"
                config_file = self._write_yaml(work / "process.yaml", url, face.key, groups_file)
                env_file = Path(job.source.env_file)
                child = start_logged(
                    "the environment",
                    [
                        self.settings.atropos_python,
                        str(env_file),
                        "process",
                        "--config",
                        str(config_file),
                    ],
                    env_file.parent,
                    atropos_environment(
                        self.settings.inspector_environment(), WANDB_MODE="disabled"
                    ),
                    work / "env.log",
                    secret=face.key,
                )
                finished = await self._wait(child, deadline)
            results = read_groups(groups_file, job.num_items or 0, face.decode)
            if not results:
                results = [self._nothing(child, finished, work)]
            elif not finished:
                for result in results:
                    result["reason"] = self._cut_reason()
            return results
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _face(self) -> InferenceFace:
        """The loopback face the environment samples through, at the request's sampling."""
        job, cfg = self.job, self.config
        return InferenceFace(
            self.tokenizer,
            SamplingDefaults(
                max_tokens=job.max_tokens,
                temperature=job.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
            ),
            self.context,
            self.end_ids,
            job.model,
            max_tokens_cap=job.max_tokens,
        )

    def _write_yaml(self, path: Path, face_url: str, key: str, groups_file: Path) -> Path:
        env = self.config.env_values()
        env.update(
            total_steps=self.job.num_items or 1,  # process mode: this many groups
            tokenizer_name=self.tokenizer_dir,
            use_wandb=False,
            include_messages=True,
            ensure_scores_are_not_same=False,
            data_path_to_save_groups=str(groups_file),
            data_dir_to_save_evals=None,
        )
        document = {
            "env": env,
            "openai": server_entries(self.job.model, face_url, key, self.tokenizer_dir),
            "slurm": False,
            "testing": False,
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        path.chmod(0o600)
        return path

    async def _wait(self, child: Process, deadline: float | None) -> bool:
        """Until the environment ends or the budget does (then it is interrupted, so that what
        it buffered reaches its file); whether it ended by itself."""
        while child.exit_code() is None:
            if deadline is not None and time.monotonic() > deadline - STARTUP_MARGIN_S:
                await asyncio.to_thread(child.interrupt)
                return False
            await asyncio.sleep(0.1)
        await asyncio.to_thread(child.join_log)
        return True

    def _cut_reason(self) -> str:
        return (
            f"the time budget of this request ({self.job.budget_s or 0:g} s, "
            "RLCS_INFERENCE_BUDGET_S) ran out before the environment scored every item"
        )

    def _nothing(self, child: Process, finished: bool, work: Path) -> dict[str, Any]:
        why = LogWatch(work / "env.log").why_nothing()
        if finished:
            reason = f"the environment scored nothing; {child.describe()}"
        else:
            reason = f"{self._cut_reason()}; it scored none ({why})"
        return {
            "prompt": None,
            "response": "",
            "score": None,
            "correct": None,
            "reason": reason,
            "truncated": not finished,
            "tokens": 0,
        }


def read_groups(path: Path, limit: int, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """One result per scored sequence of the groups the environment wrote (first `limit`):
    what was asked and answered from its messages when they hold the answer, else from its
    tokens (the masked part is the prompt)."""
    results: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return results
    for line in lines[:limit]:
        try:
            group = json.loads(line)
        except ValueError:
            continue  # the last line, cut where the process was stopped
        messages = group.get("messages") or []
        tokens_of = group.get("tokens") or []
        masks = group.get("masks") or []
        for i, score in enumerate(group.get("scores") or []):
            turns = messages[i] if i < len(messages) else []
            tokens = tokens_of[i] if i < len(tokens_of) else []
            mask = masks[i] if i < len(masks) else []
            results.append(_result(float(score), turns, tokens, mask, decode))
    return results


def _result(
    score: float,
    turns: list[Any],
    tokens: list[int],
    mask: list[int],
    decode: Callable[[list[int]], str],
) -> dict[str, Any]:
    """One scored sequence as a result; its tokens, split by the mask, when its messages do
    not hold the answer."""
    prompt, response = _split(turns)
    if prompt is None and tokens and len(mask) == len(tokens):
        prompt = decode([t for t, m in zip(tokens, mask, strict=True) if m == -100])
        response = decode([t for t, m in zip(tokens, mask, strict=True) if m != -100])
    return {
        "prompt": prompt,
        "response": response,
        "score": score,
        "correct": score >= 1.0 - 1e-9,
        "reason": None,
        "truncated": False,
        "tokens": sum(1 for m in mask if m != -100),
        "turns": [
            {"role": str(t.get("role")), "content": str(t.get("content"))}
            for t in turns
            if isinstance(t, dict)
        ],
    }


def _split(turns: list[Any]) -> tuple[str | None, str]:
    """What was asked (the conversation up to the last answer) and the last answer."""
    turns = [t for t in turns if isinstance(t, dict)]
    last = max((i for i, t in enumerate(turns) if t.get("role") == "assistant"), default=None)
    if last is None:
        text = "\n".join(str(t.get("content", "")) for t in turns)
        return None, text
    asked = [str(t.get("content", "")) for t in turns[:last] if t.get("role") != "system"]
    return ("\n".join(asked) or None), str(turns[last].get("content", ""))
