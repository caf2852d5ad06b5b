"""The local losses against values worked by hand or their definitions, and strict key checks."""

from __future__ import annotations

import math

import pytest
import torch

from core import loss_config
from core.loss_config import DRO_DEFAULT_BETA
from runners.engine.train.losses import (
    LOSSES,
    check_input_keys,
    compute_loss,
    loss_metrics,
    resolve_config,
)
from tests.support.standins.tinker_standin import LOSS_INPUT_KEYS

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


def test_importance_sampling_rollout_correction_by_hand():
    """Token TIS: the first token's ratio exp(0.5) = 1.65 truncated at 1.5 (its value and its
    gradient's weight); the band [0.5, 8] masks the second (exp(-1) = 0.37)."""
    r = [math.exp(0.5), math.exp(-1.0), 1.0]
    truncated = {"rollout_is_threshold": 1.5}
    assert _loss("importance_sampling", truncated) == pytest.approx(
        -(1.5 * 2.0 + r[1] * -1.0 + r[2] * 0.5), abs=1e-5
    )
    banded = {"rollout_rs_threshold_lower": 0.5, "rollout_rs_threshold": 8.0}
    assert _loss("importance_sampling", banded) == pytest.approx(
        -(r[0] * 2.0 + r[2] * 0.5), abs=1e-5
    )
    lp = torch.tensor(P, requires_grad=True)
    inputs = {"logprobs": torch.tensor(Q), "advantages": torch.tensor(A)}
    config = resolve_config("importance_sampling", {**truncated, **banded})
    compute_loss("importance_sampling", lp, inputs, config).backward()
    assert lp.grad is not None  # d loss / d lp = -(weight * A): 1.5 * 2, masked 0, 1 * 0.5
    assert lp.grad.tolist() == pytest.approx([-3.0, 0.0, -0.5], abs=1e-6)
    counts = loss_metrics("importance_sampling", lp, inputs, config)
    assert {k: float(counts[k]) for k in ("is_truncated:sum", "is_masked:sum")} == {
        "is_truncated:sum": 1.0,
        "is_masked:sum": 1.0,
    }
    assert float(counts["corrected_tokens:sum"]) == 2.0


def test_mismatch_metrics_by_hand():
    """k3 = r - 1 - log r over the sampled tokens (log r = trainer - sampler), the largest
    |difference| and the ratios outside [0.5, 2]; sums and a max, as the SDK merges chunks."""
    inputs = {"logprobs": torch.tensor(Q), "advantages": torch.tensor(A)}
    out = loss_metrics("importance_sampling", torch.tensor(P), inputs, resolve_config("ppo", {}))
    d = [0.5, -1.0, 0.0]
    assert float(out["mismatch_tokens:sum"]) == 3.0
    assert float(out["mismatch_k3:sum"]) == pytest.approx(sum(math.exp(x) - 1 - x for x in d))
    assert float(out["mismatch_logprob_diff:max"]) == pytest.approx(1.0)
    assert float(out["mismatch_ratio_outside:sum"]) == 1.0  # exp(-1) < 0.5
    assert float(out["corrected_tokens:sum"]) == 0.0  # no correction asked


def test_a_runs_rollout_correction_is_native_importance_samplings_alone():
    local = loss_config.with_rollout_correction("importance_sampling", {}, None, "local")
    assert local == loss_config.ROLLOUT_CORRECTION
    own = {"rollout_is_threshold": 3.0}
    assert loss_config.with_rollout_correction("importance_sampling", own, "token", "local") == {
        **loss_config.ROLLOUT_CORRECTION,
        **own,
    }
    assert loss_config.with_rollout_correction("importance_sampling", {}, "none", "local") == {}
    assert loss_config.with_rollout_correction("importance_sampling", {}, None, "tinker") == {}
    assert loss_config.with_rollout_correction("ppo", {}, "token", "local") == {}


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
        resolve_config("cross_entropy", {"beta": 0.1})
    with pytest.raises(ValueError, match="allowed keys: rollout_is_threshold"):
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


def test_every_declared_loss_is_implemented_and_every_implementation_declared():
    assert list(LOSSES) == list(loss_config.LOSSES)
    recorded = {name for name, loss in loss_config.LOSSES.items() if loss.reads_recorded}
    assert {name for name, spec in LOSSES.items() if spec.reads_recorded} == recorded
    assert recorded == {"stable_reinforce"}


def test_defaults_match_the_hosted_service():
    assert resolve_config("ppo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_config("cispo", None) == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    assert resolve_config("cispo", {"clip_high_threshold": 2}) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 2.0,
    }


# ----- gspo and stable_reinforce against their definitions ---------------------------------


def _random_datums(seed: int, lengths: list[int], prompt: list[int]) -> dict[str, torch.Tensor]:
    """Concatenated datums of the given lengths; the first prompt[i] positions of datum i are
    its prompt (sampler logprob 0, advantage 0, outside the sequence ratio), as clients send."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    lp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    q = lp + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.2
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    sampled = torch.ones(n, dtype=torch.float64)
    start = 0
    for length, p in zip(lengths, prompt, strict=True):
        sampled[start : start + p] = 0
        start += length
    return {"lp": lp, "q": q * sampled, "adv": adv * sampled, "sampled": sampled}


def _gspo_by_definition(d: dict, lengths: list[int], low: float, high: float):
    """Per datum, by loops: value sum_t min(s A_t, clip(s) A_t) with s the geometric mean ratio
    over the marked tokens, and d loss / d lp_t = -s A_t where the unclipped branch is taken
    (s < high for A > 0, s > low for A < 0), else 0: s's value is constant in GSPO-token."""
    loss, grad, start = 0.0, [], 0
    for length in lengths:
        rows = range(start, start + length)
        marked = [t for t in rows if d["sampled"][t] != 0]
        s = math.exp(sum(float(d["lp"][t] - d["q"][t]) for t in marked) / max(1, len(marked)))
        for t in rows:
            a = float(d["adv"][t])
            loss -= min(s * a, min(max(s, low), high) * a)
            unclipped = (a > 0 and s < high) or (a < 0 and s > low)
            grad.append(-s * a if unclipped else 0.0)
        start += length
    return loss, torch.tensor(grad, dtype=torch.float64)


@pytest.mark.parametrize(("low", "high"), [(0.8, 1.2), (0.95, 1.02), (1.0 - 3e-4, 1.0 + 4e-4)])
def test_gspo_equals_its_definition(low, high):
    lengths, prompt = [7, 3, 12, 5], [3, 1, 4, 0]
    d = _random_datums(1, lengths, prompt)
    lp = d["lp"].clone().requires_grad_(True)
    inputs = {"logprobs": d["q"], "advantages": d["adv"], "sequence_ratio_mask": d["sampled"]}
    config = resolve_config("gspo", {"clip_low_threshold": low, "clip_high_threshold": high})
    loss = compute_loss("gspo", lp, inputs, config, lengths)
    loss.backward()
    expected, expected_grad = _gspo_by_definition(d, lengths, low, high)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    assert torch.allclose(lp.grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_gspo_ratio_is_per_sequence():
    # Two datums: the same tokens, but the second datum's learner moved away from the sampler.
    # Each datum's tokens carry its own sequence's ratio; one datum alone gives the same loss.
    lp = torch.tensor([-1.0, -1.0, -2.0, -2.0])
    q = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0])
    inputs = {"logprobs": q, "advantages": adv, "sequence_ratio_mask": torch.ones(4)}
    config = resolve_config("gspo", None)
    # datum 0: s = 1 -> 1 + 1; datum 1: s = e^-1, below 0.8, and with A > 0 the min takes the
    # unclipped s A -> 2 e^-1
    expected = -(2.0 + 2 * math.exp(-1.0))
    assert float(compute_loss("gspo", lp, inputs, config, [2, 2])) == pytest.approx(expected)
    # Read as one sequence instead, the ratio is exp(-1/2) for all four.
    assert float(compute_loss("gspo", lp, inputs, config)) == pytest.approx(-4 * math.exp(-0.5))


def test_gspo_with_no_marked_token_has_ratio_one():
    lp = torch.tensor([-1.0, -3.0], requires_grad=True)
    inputs = {
        "logprobs": torch.tensor([-2.0, -2.0]),
        "advantages": torch.tensor([1.0, -1.0]),
        "sequence_ratio_mask": torch.zeros(2),
    }
    loss = compute_loss("gspo", lp, inputs, resolve_config("gspo", None))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0)  # -(1 * 1 + 1 * -1)
    assert torch.equal(lp.grad, torch.tensor([-1.0, 1.0]))


def _stable_inputs(d: dict) -> dict[str, torch.Tensor]:
    return {
        "advantages": d["adv"],
        "recorded_logprobs": d["q"],
        "recorded_mask": d["sampled"],
    }


def _stable_by_definition(d: dict, cfg: dict):
    """Token by token: m_t (w_t A_t lp_t - kl/2 (lp_t - q_t)^2) with r_t = exp(lp_t - q_t),
    m_t = sampled and mask_low <= r_t <= mask_high, w_t = clip(r_t, clip_low, clip_high);
    gradient of the loss -m_t (w_t A_t - kl (lp_t - q_t))."""
    loss, grad, masked, truncated = 0.0, [], 0, 0
    for lp, q, a, s in zip(d["lp"], d["q"], d["adv"], d["sampled"], strict=True):
        lp, q, a = float(lp), float(q), float(a)
        r = math.exp(lp - q)
        kept = s != 0 and cfg["mask_low_threshold"] <= r <= cfg["mask_high_threshold"]
        masked += int(s != 0 and not kept)
        if not kept:
            grad.append(0.0)
            continue
        w = min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"])
        truncated += int(w != r)
        loss -= w * a * lp - cfg["kl_coeff"] / 2 * (lp - q) ** 2
        grad.append(-(w * a - cfg["kl_coeff"] * (lp - q)))
    return loss, torch.tensor(grad, dtype=torch.float64), masked, truncated


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"mask_low_threshold": 0.6, "mask_high_threshold": 1.5, "clip_high_threshold": 1.2},
        {"kl_coeff": 0.3, "clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    ],
)
def test_stable_reinforce_equals_its_definition(config):
    lengths, prompt = [9, 4, 14], [2, 0, 5]
    d = _random_datums(2, lengths, prompt)
    # Push a few sampled tokens far from the sampler, both ways: masked by the default band.
    d["q"][[3, 10, 20]] += torch.tensor([3.0, -3.0, 2.5], dtype=torch.float64)
    lp = d["lp"].clone().requires_grad_(True)
    cfg = resolve_config("stable_reinforce", config)
    loss = compute_loss("stable_reinforce", lp, _stable_inputs(d), cfg, lengths)
    loss.backward()
    expected, expected_grad, masked, truncated = _stable_by_definition(d, cfg)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    assert torch.allclose(lp.grad, expected_grad, rtol=1e-12, atol=1e-12)
    metrics = loss_metrics("stable_reinforce", lp, _stable_inputs(d), cfg)
    assert float(metrics["sampled_tokens:sum"]) == sum(lengths) - sum(prompt)
    assert float(metrics["masked_tokens:sum"]) == masked
    assert float(metrics["truncated_tokens:sum"]) == truncated
    assert masked >= 3 and (config is None or truncated > 0)


def test_stable_reinforce_gradient_stays_bounded_where_importance_sampling_explodes():
    # A sampled token the learner now likes 50 times more than the stale sampler did.
    lp = torch.tensor([-0.5, -1.0], requires_grad=True)
    q = torch.tensor([-0.5 - math.log(50.0), -1.0 - math.log(1.5)])
    adv = torch.tensor([1.0, 1.0])
    compute_loss("importance_sampling", lp, {"logprobs": q, "advantages": adv}, {}).backward()
    assert lp.grad[0] == pytest.approx(-50.0)
    lp.grad = None
    inputs = {"advantages": adv, "recorded_logprobs": q, "recorded_mask": torch.ones(2)}
    compute_loss(
        "stable_reinforce", lp, inputs, resolve_config("stable_reinforce", None)
    ).backward()
    assert lp.grad[0] == 0  # ratio 50 is outside the default band [1/8, 8]: masked
    # Inside: the plain importance weight, less the default drift penalty's pull.
    assert lp.grad[1] == pytest.approx(-(1.5 - 0.05 * math.log(1.5)))


def test_stable_reinforce_config_defaults_and_checks():
    assert resolve_config("stable_reinforce", None) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 2.0,
        "mask_low_threshold": 0.125,
        "mask_high_threshold": 8.0,
        "kl_coeff": 0.05,
    }
    assert resolve_config("gspo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    # loss_fn_config_v2 carries text too: a number written as text is read as the number.
    assert resolve_config("stable_reinforce", {"kl_coeff": " 0.25"})["kl_coeff"] == 0.25
    with pytest.raises(ValueError, match=r"kl_coeff'\] must be a number, got 'some'"):
        resolve_config("stable_reinforce", {"kl_coeff": "some"})
    with pytest.raises(ValueError, match=r"mask_low_threshold'\] = 1.5 is outside \[0, 1\]"):
        resolve_config("stable_reinforce", {"mask_low_threshold": 1.5})
    with pytest.raises(ValueError, match=r"mask_high_threshold'\] = 0.5 is outside \[1, 1e\+06\]"):
        resolve_config("stable_reinforce", {"mask_high_threshold": 0.5})
    with pytest.raises(ValueError, match="unknown loss_fn_config key 'beta'.*kl_coeff"):
        resolve_config("stable_reinforce", {"beta": 0.1})
    with pytest.raises(ValueError, match="must not exceed"):
        resolve_config("gspo", {"clip_low_threshold": 1.3})


# ----- the new losses' inputs are what the SDK's users send ------------------------------


def test_gspo_inputs_are_the_hosted_services():
    # The stand-in encodes the hosted service's rule: these keys, the mask optional (the
    # cookbook's RL trainer, rl/train.py, sends none).
    required, optional = LOSS_INPUT_KEYS["gspo"]
    assert set(LOSSES["gspo"].inputs) == required and set(LOSSES["gspo"].optional) == optional
    check_input_keys("gspo", required | optional)
    check_input_keys("gspo", required)
    with pytest.raises(ValueError, match="missing required key 'advantages'"):
        check_input_keys("gspo", ["target_tokens", "logprobs"])


def test_stable_reinforce_inputs_are_what_the_cookbook_sends():
    # tinker-cookbook 0.6.1 builds its datums with target_tokens, logprobs, advantages (and a
    # "mask" it strips before sending: rl/train.py _remove_mask; recipes/rl_loop.py the same
    # three), plus provenance spans. The sampler logprobs it sends are accepted, not used.
    check_input_keys("stable_reinforce", ["target_tokens", "logprobs", "advantages"])
    check_input_keys("stable_reinforce", ["target_tokens", "advantages"])
    with pytest.raises(ValueError, match="unknown key 'mask'.*target_tokens, advantages, logprobs"):
        check_input_keys("stable_reinforce", ["target_tokens", "logprobs", "advantages", "mask"])
    with pytest.raises(ValueError, match="missing required key 'advantages'"):
        check_input_keys("stable_reinforce", ["target_tokens", "logprobs"])
