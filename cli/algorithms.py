"""What `runs status` and `runs watch` show of a run's algorithm, when it has one: how far off
policy its steps train (max_steps_off_policy), its KL to the reference, its teacher's reverse
KL, and how far its trainer is from its sampler (the mismatch, and what the rollout correction
touched): the newest step's values, from its metric history."""

from __future__ import annotations

from typing import Any

from cli.client import Client, seg
from cli.output import fmt

KEYS = (
    "sampler/steps_off_policy",
    "sampler/steps_off_policy_max",
    "sampler/stale_groups_dropped",
    "kl/reference",
    "teacher/reverse_kl",
    "mismatch/k3",
    "mismatch/abs_max",
    "mismatch/ratio_outside",
    "mismatch/corrected",
)
# An evaluation's row has none of these: a few rows back always reach a step's.
ROWS = 3


def latest(client: Client, run_id: str) -> dict[str, Any]:
    """The newest recorded values of KEYS (none for a run that records none of them)."""
    answer = client.get(
        f"/runs/{seg(run_id)}/history", params={"keys": ",".join(KEYS), "limit": ROWS}
    )
    rows = answer.get("rows") or []
    return {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}


def items(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs for `runs status`."""
    out = []
    if "sampler/steps_off_policy" in values:
        out.append(
            (
                "off policy",
                f"{fmt(values['sampler/steps_off_policy'])} steps (max "
                f"{fmt(values.get('sampler/steps_off_policy_max'))}, "
                f"{fmt(values.get('sampler/stale_groups_dropped'))} stale groups dropped)",
            )
        )
    if "kl/reference" in values:
        out.append(("KL to reference", fmt(values["kl/reference"])))
    if "teacher/reverse_kl" in values:
        out.append(("teacher reverse KL", fmt(values["teacher/reverse_kl"])))
    if "mismatch/k3" in values:
        out.append(("sampler mismatch", mismatch(values)))
    return out


def mismatch(values: dict[str, Any]) -> str:
    """k3, the largest |logprob difference|, the shares outside [0.5, 2] and corrected."""
    text = (
        f"k3 {fmt(values['mismatch/k3'])}, max |diff| {fmt(values.get('mismatch/abs_max'))}, "
        f"{percent(values.get('mismatch/ratio_outside'))} of ratios outside [0.5, 2]"
    )
    if "mismatch/corrected" in values:
        text += f", {percent(values['mismatch/corrected'])} of tokens corrected"
    return text


def percent(share: Any) -> str:
    return "-" if share is None else f"{100 * float(share):.2f}%"


def brief(values: dict[str, Any]) -> list[str]:
    """Words for `runs watch`'s progress line."""
    out = []
    if "sampler/steps_off_policy_max" in values:
        out.append(f"off-policy {fmt(values['sampler/steps_off_policy_max'])}")
    if "kl/reference" in values:
        out.append(f"kl {fmt(values['kl/reference'])}")
    if "teacher/reverse_kl" in values:
        out.append(f"teacher-kl {fmt(values['teacher/reverse_kl'])}")
    if "mismatch/k3" in values:
        out.append(f"mismatch-k3 {fmt(values['mismatch/k3'])}")
    return out
