"""What an Atropos environment says about itself, read as it writes it: its log (the groups
atroposlib's BaseEnv dropped and why, the errors its workers hit), what it logs to W&B (copied
to a file by the envside hook), and its evaluations (`evaluate_log` writes metrics.json).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# atroposlib 0.4's own messages (envs/base.py) for a group it does not send, by reason.
DROP_MESSAGES = {
    "equal_scores": "Scores are the same in a group, skipping",
    "too_long": "Token length is too long in a group, skipping",
    "malformed": "Group structure invalid, or token count mismatch",
    "collect_error": "Error in collect_trajectories",
    "score_error": "Error in scoring",
    "send_error": "Failed to send",
    "worker_timeout": "has timed out after",
}
REASONS = {
    "equal_scores": "every score in the group was the same (ensure_scores_are_not_same drops "
    "those: the group teaches nothing)",
    "too_long": "a sequence reached the longest the trainer takes (max_token_trainer_length, "
    "or the model's context)",
    "malformed": "the group's size or shape was not what group_size says",
    "collect_error": "collect_trajectories raised",
    "score_error": "scoring raised",
    "send_error": "sending to the trajectory API failed",
    "worker_timeout": "a worker ran past worker_timeout",
}
ERROR_KINDS = ("collect_error", "score_error", "send_error")


@dataclass
class LogWatch:
    """The environment's log, read from where the last look stopped."""

    path: Path
    offset: int = 0
    since_step: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    last_error: str | None = None
    _partial: str = ""

    def read(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            for kind, message in DROP_MESSAGES.items():
                if message in line:
                    self.since_step[kind] += 1
                    self.total[kind] += 1
                    if kind in ERROR_KINDS:
                        self.last_error = line.strip()[-300:]

    def take(self) -> dict[str, float]:
        """Groups the environment dropped since the last step, by reason, as metrics."""
        self.read()
        out = {f"atropos/env_dropped/{k}": float(v) for k, v in self.since_step.items()}
        out["atropos/env_dropped"] = float(sum(self.since_step.values()))
        self.since_step = Counter()
        return out

    def why_nothing(self) -> str:
        """Why no usable group came, as far as the log tells."""
        self.read()
        if not self.total:
            return (
                "the environment's log shows no dropped group: its collect_trajectories "
                "returned nothing usable (None, e.g. its score() gives None for groups it "
                "rejects), or it is still working on its first items"
            )
        parts = [f"{n} x {REASONS[k]}" for k, n in self.total.most_common()]
        text = "the environment dropped groups: " + "; ".join(parts)
        if self.last_error:
            text += f". Last error: {self.last_error}"
        return text


@dataclass
class MetricsTap:
    """What the environment logged to W&B, from the hook's JSON lines; the prefix atroposlib
    puts before an environment's own keys (`<wandb_name>_0_`) is taken off."""

    path: Path
    prefix: str
    offset: int = 0

    def take(self) -> dict[str, float]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return {}
        complete = data.rpartition(b"\n")[0]
        if not complete:
            return {}
        self.offset += len(complete) + 1
        out: dict[str, float] = {}
        pattern = re.compile(rf"^{re.escape(self.prefix)}_\d+_")
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            for key, value in (record.get("metrics") or {}).items():
                if isinstance(value, int | float):
                    out[f"atropos/{pattern.sub('', key)}"] = float(value)
        return out


@dataclass
class EvalWatch:
    """The environment's evaluation results (metrics.json, rewritten after each one)."""

    path: Path
    seen: float = 0.0

    def take(self) -> dict[str, float]:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime == self.seen:
            return {}
        try:
            results = json.loads(self.path.read_text()).get("results", {}).get("all", {})
        except (OSError, ValueError, AttributeError):
            return {}  # being written: the next look reads it
        self.seen = mtime
        out = {}
        for key, value in results.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key if key.startswith("eval/") else f"eval/{key}"] = float(value)
        return out
