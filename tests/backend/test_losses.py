"""The local losses against values worked by hand, gradient signs, and strict key checks."""

from __future__ import annotations

import math

import pytest
import torch

from core.loss_config import DRO_DEFAULT_BETA
from runners.engine.losses import check_input_keys, compute_loss, resolve_config

# A three-token example: learner logprobs p, sampler logprobs q, advantages A, weights w.
P = [-1.0, -2.0, -0.5]
Q = [-1.5, -1.0, -0.5]
A = [2.0, -1.0, 0.5]
W = [1.0, 0.0, 1.0]


def _inputs() -> dict[str, torch.Tensor]:
    return {
        "logprobs": torch.tensor(Q),
        "advantages": torch.tensor(A),
        "weights": torch.tensor(W),
    }


def _loss(name: str, config: dict | None = None, lp: list[float] = P) -> float:
    inputs = _inputs()
    if name == "cross_entropy":
        inputs = {"weights": inputs["weights"]}
    else:
        del inputs["weights"]
    return float(compute_loss(name, torch.tensor(lp), inputs, resolve_config(name, config)))


def test_cross_entropy_is_minus_weighted_sum():
    # -(1*(-1) + 0*(-2) + 1*(-0.5))
    assert _loss("cross_entropy") == pytest.approx(1.5)


def test_importance_sampling_by_hand():
    r = [math.exp(0.5), math.exp(-1.0), 1.0]  # exp(p - q)
    expected = -(r[0] * 2.0 + r[1] * -1.0 + r[2] * 0.5)
    assert expected == pytest.approx(-3.4295631, abs=1e-6)
    assert _loss("importance_sampling") == pytest.approx(expected, abs=1e-5)


def test_ppo_clips_with_default_thresholds():
    # ratios 1.6487, 0.3679, 1.0 -> clipped 1.2, 0.8, 1.0
    # min(r*A, clip*A) = min(3.297, 2.4), min(-0.368, -0.8), min(0.5, 0.5) = 2.4, -0.8, 0.5
    assert _loss("ppo") == pytest.approx(-(2.4 - 0.8 + 0.5), abs=1e-6)


def test_ppo_with_wider_thresholds():
    # clip to [0.3, 2.0]: nothing clips, so PPO equals importance sampling here
    config = {"clip_low_threshold": 0.3, "clip_high_threshold": 2.0}
    assert _loss("ppo", config) == pytest.approx(_loss("importance_sampling"), abs=1e-6)


def test_cispo_by_hand():
    # default clip [0, 4] leaves the ratios alone: sum of r * p * A
    r = [math.exp(0.5), math.exp(-1.0), 1.0]
    expected = -(r[0] * -1.0 * 2.0 + r[1] * -2.0 * -1.0 + 1.0 * -0.5 * 0.5)
    assert expected == pytest.approx(2.8116836, abs=1e-6)
    assert _loss("cispo") == pytest.approx(expected, abs=1e-5)
    # with clip_high 1.5 the first ratio becomes 1.5
    clipped = -(1.5 * -1.0 * 2.0 + r[1] * -2.0 * -1.0 + 1.0 * -0.5 * 0.5)
    assert _loss("cispo", {"clip_high_threshold": 1.5}) == pytest.approx(clipped, abs=1e-5)


def test_dro_by_hand():
    # p*A - beta/2 * (p - q)^2 with beta 0.05: (-2 - 0.00625) + (2 - 0.025) + (-0.25 - 0)
    assert DRO_DEFAULT_BETA == 0.05
    assert _loss("dro") == pytest.approx(0.28125, abs=1e-6)
    # beta 1.0: (-2 - 0.125) + (2 - 0.5) + (-0.25) = -0.875
    assert _loss("dro", {"beta": 1.0}) == pytest.approx(0.875, abs=1e-6)


def test_dro_drift_covers_sampled_tokens_only():
    # The same three sampled tokens after a two-token prompt. Prompt positions carry the datum
    # convention (sampler logprob 0, advantage 0); the learner gives them logprobs -3 and -4,
    # whose "drift" from 0 must not count: the loss is the three-token one above.
    lp = [-3.0, -4.0, *P]
    inputs = {"logprobs": torch.tensor([0.0, 0.0, *Q]), "advantages": torch.tensor([0.0, 0.0, *A])}
    config = resolve_config("dro", None)
    assert float(compute_loss("dro", torch.tensor(lp), inputs, config)) == pytest.approx(0.28125)


@pytest.mark.parametrize("name", ["importance_sampling", "ppo", "cispo", "dro"])
def test_all_zero_advantages_give_zero_loss_and_gradient(name):
    # A batch whose groups all tied: sampled tokens re-scored exactly (p == q), advantages 0.
    # No loss may train on it, DRO included (its drift was summed over the prompt once).
    lp = torch.tensor([-3.0, -4.0, -1.0, -2.0], requires_grad=True)
    inputs = {
        "logprobs": torch.tensor([0.0, 0.0, -1.0, -2.0]),
        "advantages": torch.zeros(4),
    }
    loss = compute_loss(name, lp, inputs, resolve_config(name, None))
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert torch.count_nonzero(lp.grad) == 0


def _grad(name: str, advantages: list[float]) -> torch.Tensor:
    """d loss / d target_logprobs at p == q (ratio 1, so no clipping)."""
    lp = torch.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([-1.0, -1.0, -1.0]), "advantages": torch.tensor(advantages)}
    compute_loss(name, lp, inputs, resolve_config(name, None)).backward()
    return lp.grad


@pytest.mark.parametrize("name", ["importance_sampling", "ppo", "cispo", "dro"])
def test_rl_gradient_raises_logprob_of_positive_advantage(name):
    grad = _grad(name, [1.5, -2.0, 0.0])
    # Gradient descent moves p against the gradient: up for A > 0, down for A < 0.
    assert grad[0] < 0 and grad[1] > 0 and grad[2] == 0
    # At ratio 1 every one of these objectives has gradient -A with respect to p.
    assert torch.allclose(grad, torch.tensor([-1.5, 2.0, 0.0]))


def test_ppo_gradient_is_zero_where_clipped():
    lp = torch.tensor(P, requires_grad=True)
    inputs = {"logprobs": torch.tensor(Q), "advantages": torch.tensor(A)}
    compute_loss("ppo", lp, inputs, resolve_config("ppo", None)).backward()
    # tokens 0 and 1 are clipped (ratio above 1.2 with A > 0, below 0.8 with A < 0)
    assert lp.grad[0] == 0 and lp.grad[1] == 0
    assert lp.grad[2] == pytest.approx(-0.5)


def test_cispo_stops_gradient_through_the_ratio():
    lp = torch.tensor(P, requires_grad=True)
    inputs = {"logprobs": torch.tensor(Q), "advantages": torch.tensor(A)}
    compute_loss("cispo", lp, inputs, resolve_config("cispo", None)).backward()
    # d/dp of -(sg(r) * p * A) is -r*A (no term from differentiating r)
    assert lp.grad[0] == pytest.approx(-math.exp(0.5) * 2.0, abs=1e-5)


def test_cross_entropy_gradient_is_minus_weights():
    lp = torch.tensor(P, requires_grad=True)
    compute_loss("cross_entropy", lp, {"weights": torch.tensor(W)}, {}).backward()
    assert torch.equal(lp.grad, -torch.tensor(W))


def test_unknown_input_key_is_rejected_with_the_allowed_ones():
    with pytest.raises(
        ValueError, match=r"unknown key 'mask'.*target_tokens, logprobs, advantages"
    ):
        check_input_keys("ppo", ["target_tokens", "logprobs", "advantages", "mask"])


def test_missing_input_key_is_rejected():
    with pytest.raises(ValueError, match="missing required key 'advantages'"):
        check_input_keys("importance_sampling", ["target_tokens", "logprobs"])
    with pytest.raises(ValueError, match="missing required key 'weights'"):
        check_input_keys("cross_entropy", ["target_tokens"])


def test_unknown_config_key_is_rejected():
    with pytest.raises(ValueError, match=r"unknown loss_fn_config key 'clip_ratio'.*clip_high"):
        resolve_config("ppo", {"clip_ratio": 0.2})
    with pytest.raises(ValueError, match="allowed keys: none"):
        resolve_config("importance_sampling", {"beta": 0.1})


def test_bad_config_values_are_rejected():
    with pytest.raises(ValueError, match="must be a number"):
        resolve_config("dro", {"beta": "high"})
    with pytest.raises(ValueError, match=r"beta'\] = -0.1 is outside \[0, 100\]"):
        resolve_config("dro", {"beta": -0.1})
    with pytest.raises(ValueError, match="is outside"):
        resolve_config("ppo", {"clip_high_threshold": float("inf")})
    with pytest.raises(ValueError, match="must not exceed"):
        resolve_config("ppo", {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2})


def test_unknown_loss_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unknown loss_fn 'grpo'.*cispo, cross_entropy, dro"):
        resolve_config("grpo", None)


def test_defaults_match_the_hosted_service():
    assert resolve_config("ppo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_config("cispo", None) == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    assert resolve_config("cispo", {"clip_high_threshold": 2}) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 2.0,
    }
