"""A step's episodes as rollout records (core/rollouts.py): each turn's prompt as the environment's
text and its completion as the model's, with rewards, the advantages they were trained with, the
finish reason, token counts, the sampler's mean logprob and the environment's metrics."""

from __future__ import annotations

from collections.abc import Callable

from core.rollouts import RolloutRecord, Segment
from runners.episodes.rollouts import Episode, Transition
from runners.train.learner import TURN, Sequence


def episode_records(
    episodes: list[Episode],
    trained: list[Sequence],
    decode: Callable[[list[int]], str],
    stop_ids: list[int],
) -> list[RolloutRecord]:
    """Every episode of the step, in the order collected (those whose group was dropped for
    having no signal too, with no advantage: a step's records average to its reward/mean).
    `trained`: the learner's sequences, one per turn trained on, tagged with their `TURN`."""
    advantage = {s.meta[TURN]: s.mean_advantage() for s in trained if TURN in s.meta}
    stops = set(stop_ids)
    out = []
    for index, episode in enumerate(episodes):
        turn_advantages = [advantage.get((index, j)) for j in range(len(episode.transitions))]
        segments = _turn_segments(episode.transitions, turn_advantages, decode)
        trained_on = [a for a in turn_advantages if a is not None]
        transitions = episode.transitions
        logprobs = [lp for t in transitions for lp in t.action_logprobs]
        out.append(
            RolloutRecord(
                kind="episode",
                group=episode.group,
                index=index,
                prompt=segments[0].text if segments else "",
                completion="\n".join(s.text for s in segments if s.role == "model"),
                reward=episode.total_reward,
                advantage=sum(trained_on) / len(trained_on) if trained_on else None,
                segments=segments,
                finish_reason=_finish(transitions[-1], stops) if transitions else None,
                prompt_tokens=len(transitions[0].prompt_tokens) if transitions else 0,
                completion_tokens=sum(len(t.action_tokens) for t in transitions),
                logprob_mean=sum(logprobs) / len(logprobs) if logprobs else None,
                metrics=_metrics(transitions),
                turns=len(transitions),
                source=episode.source,
                trained=bool(trained_on),
            )
        )
    return out


def _turn_segments(
    transitions: list[Transition],
    turn_advantages: list[float | None],
    decode: Callable[[list[int]], str],
) -> list[Segment]:
    """Each turn as the environment's text, then the model's with its reward and advantage."""
    segments: list[Segment] = []
    for t, turn_advantage in zip(transitions, turn_advantages, strict=True):
        segments.append(Segment("env", decode(t.prompt_tokens), len(t.prompt_tokens)))
        segments.append(
            Segment(
                "model",
                decode(t.action_tokens),
                len(t.action_tokens),
                reward=t.reward,
                advantage=turn_advantage,
            )
        )
    return segments


def _finish(last: Transition, stops: set[int]) -> str:
    """stop: the model ended its turn (the sampler keeps the stop token); length: it was cut at
    the turn's token limit (or the sampler's deadline)."""
    return "stop" if last.action_tokens and last.action_tokens[-1] in stops else "length"


def _metrics(transitions: list[Transition]) -> dict[str, float]:
    """What the environment reported, summed over the turns (as the step's env/ metrics)."""
    out: dict[str, float] = {}
    for t in transitions:
        for key, value in t.metrics.items():
            out[key] = out.get(key, 0.0) + float(value)
    return out
