"""One run sampling on several engine hosts (issue 55; a config's `sample_hosts`): rollout data
parallel, no collectives. Each host holds the run's base; the trainer's host samples from its
snapshot, the others from the same weights saved as a sampler checkpoint and opened there.

    step's weights -> home: snapshot; others: save_weights_for_sampler, opened
    -> SpreadSampling: each sample() call to the host with the fewest calls in flight
    (the batch it draws is tagged with its policy step by whoever drew it, as on one host)

A call is answered whole by one host, and a row's draw depends on its prompt, seed and weights
(runners/engine/README.md): the same call gives the same tokens and logprobs on either host.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runners.backends.engine_backend import EngineSampling, EngineService, EngineTraining

# The sampler checkpoint the other hosts open, in the run's checkpoint folder, replaced each step.
ROLLOUT_WEIGHTS = "rollout-weights"


class SpreadSampling:
    """SamplingClient: samplers of one version of a run's weights on several hosts."""

    def __init__(self, parts: list[EngineSampling]) -> None:
        self.parts = parts
        self._in_flight = [0] * len(parts)
        self._answered = [0] * len(parts)  # calls each part took, since the last take
        self._turns = itertools.count()
        self._lock = threading.Lock()

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """The part with the fewest calls in flight answers (ties in turn)."""
        with self._lock:
            turn = next(self._turns)
            order = sorted(
                range(len(self.parts)),
                key=lambda i: (self._in_flight[i], (i - turn) % len(self.parts)),
            )
            chosen = order[0]
            self._in_flight[chosen] += 1
        future = self.parts[chosen].sample(*args, **kwargs)
        future.add_done_callback(lambda _: self._done(chosen))
        return future

    def take_answered(self) -> list[int]:
        """The calls each part took since the last take (the trainer's host first)."""
        with self._lock:
            answered, self._answered = self._answered, [0] * len(self.parts)
        return answered

    def _done(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1
            self._answered[index] += 1

    def __getattr__(self, name: str) -> Any:
        # compute_logprobs, get_tokenizer, get_base_model: the trainer's host's sampler.
        return getattr(self.parts[0], name)


def spread_metrics(sampler: object) -> dict[str, float]:
    """sampler/ metrics of a spread sampler's calls since the last: its hosts, and the share
    of its calls the hosts other than the trainer's answered; none for a sampler of one host."""
    if not isinstance(sampler, SpreadSampling) or len(sampler.parts) == 1:
        return {}
    answered = sampler.take_answered()
    total = sum(answered)
    return {
        "sampler/hosts": float(len(answered)),
        "sampler/other_hosts_share": (total - answered[0]) / total if total else 0.0,
    }


async def spread(
    training: EngineTraining,
    home: EngineSampling,
    others: list[EngineService],
) -> SpreadSampling:
    """The run's current weights on every host: `home` (the trainer's snapshot), and on each
    of `others`, the same weights saved once and opened there."""
    if not others:
        return SpreadSampling([home])
    saved = await training.save_weights_for_sampler(ROLLOUT_WEIGHTS)
    opened = await asyncio.gather(
        *(service.create_sampling_client(model_path=saved.path) for service in others)
    )
    return SpreadSampling([home, *opened])
