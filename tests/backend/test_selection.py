"""Batched token selection against a per-row reference, its distribution, its uniforms and
its bans."""

from __future__ import annotations

import math

import pytest
import torch

from runners.engine.sample.selection import row_keys, row_uniforms, select_tokens


def settings(rows: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "logits": torch.randn(rows, vocab, generator=g) * 3,
        "temperature": torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 1.0][:rows]),
        "top_k": torch.tensor([-1, -1, 5, -1, 1, -1][:rows]),
        "top_p": torch.tensor([1.0, 1.0, 1.0, 0.5, 1.0, 0.9][:rows]),
        "seeds": torch.tensor([3, 2**62 + 17, 11, 12, 13, 2**40][:rows]),
        "counters": torch.tensor([0, 4, 9, 1, 2, 100][:rows]),
    }


def pick(s: dict[str, torch.Tensor], rows: slice | list[int]) -> torch.Tensor:
    keys = row_keys(s["seeds"][rows], s["counters"][rows])
    return select_tokens(
        s["logits"][rows], s["temperature"][rows], s["top_k"][rows], s["top_p"][rows], keys
    )


def test_batched_equals_one_row_at_a_time() -> None:
    s = settings(6, 1000)
    batched = pick(s, slice(None))
    for r in range(6):
        assert torch.equal(batched[:, r], pick(s, [r])[:, 0])
    # Reordering the batch reorders the answers and changes nothing else.
    order = [5, 3, 1, 0, 2, 4]
    assert torch.equal(pick(s, order), batched[:, order])


def test_greedy_top_k_1_and_tiny_top_p_take_the_argmax() -> None:
    s = settings(6, 1000)
    tokens = pick(s, slice(None))[0].long()
    argmax = s["logits"].argmax(-1)
    assert tokens[0] == argmax[0]  # temperature 0
    assert tokens[4] == argmax[4]  # top_k 1
    tiny = dict(s, top_p=torch.full((6,), 1e-6))
    assert torch.equal(pick(tiny, slice(1, 6))[0].long(), argmax[1:])


def test_logprobs_are_raw_model_logprobs_of_the_chosen_tokens() -> None:
    s = settings(6, 1000)
    tokens, logprobs = pick(s, slice(None))
    raw = torch.log_softmax(s["logits"], -1).gather(-1, tokens.long()[:, None])[:, 0]
    assert torch.allclose(logprobs, raw)


def test_top_k_and_top_p_never_pick_outside_their_set() -> None:
    vocab = 50
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)) * 2
    probs = torch.softmax(logits[0], -1)
    top5 = set(probs.topk(5).indices.tolist())
    nucleus, mass = set(), 0.0
    for index in probs.argsort(descending=True).tolist():
        if mass >= 0.5:
            break
        nucleus.add(index)
        mass += float(probs[index])
    for counter in range(300):
        keys = row_keys(torch.tensor([7]), torch.tensor([counter]))
        one = torch.tensor([1.0])
        k = select_tokens(logits, one, torch.tensor([5]), one, keys)[0].long().item()
        p = select_tokens(logits, one, torch.tensor([-1]), torch.tensor([0.5]), keys)[0]
        assert k in top5 and int(p.item()) in nucleus


def test_draws_follow_the_softmax() -> None:
    """Many draws of one row (counters 0..n) against the probabilities: a chi-square test."""
    vocab, n = 8, 20_000
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, 1.5]])
    keys = row_keys(torch.full((n,), 99), torch.arange(n))
    tokens = select_tokens(
        logits.expand(n, vocab),
        torch.ones(n),
        torch.full((n,), -1),
        torch.ones(n),
        keys,
        filtered=False,
    )[0].long()
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = torch.softmax(logits[0].double(), -1) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # p = 0.001 for 7 degrees of freedom


def test_uniforms_are_uniform_and_differ_across_rows_and_counters() -> None:
    keys = row_keys(torch.full((50_000,), 1), torch.arange(50_000))
    u = row_uniforms(keys)
    assert u.dtype == torch.float64
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    # Deciles hold a tenth each (a loose check of the whole range, not just the mean).
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert float((counts / len(u) - 0.1).abs().max()) < 0.01
    assert len(set(u.tolist())) == len(u)
    assert torch.equal(row_uniforms(keys[:3]), u[:3])  # a pure function of the key


def test_a_banned_id_is_never_drawn_and_keeps_its_raw_logprob() -> None:
    """The ban removes ids from the draw (greedy rows too); the reported logprob stays the
    raw model's, and a row whose flag is off draws as if nothing were banned."""
    logits = torch.tensor([[0.0, 4.0, 1.0, 3.0]]).expand(4, 4)
    temperature = torch.tensor([0.0, 1.0, 1.0, 0.0])
    ids = torch.tensor([[1, 3]] * 4)
    on = torch.tensor([True, True, False, False])
    tokens_seen: list[set[int]] = [set() for _ in range(4)]
    for counter in range(200):
        keys = row_keys(torch.arange(4), torch.full((4,), counter))
        tokens, logprobs = select_tokens(
            logits, temperature, torch.full((4,), -1), torch.ones(4), keys, ban=(ids, on)
        )
        raw = torch.log_softmax(logits, -1).gather(-1, tokens.long()[:, None])[:, 0]
        assert torch.allclose(logprobs, raw)
        for row, token in enumerate(tokens.long().tolist()):
            tokens_seen[row].add(token)
    assert tokens_seen[0] == {2}  # greedy, 1 and 3 banned: the next best
    assert tokens_seen[1] <= {0, 2} and tokens_seen[1] == {0, 2}
    assert {1, 3} <= tokens_seen[2]  # not banned: the likely ids come up
    assert tokens_seen[3] == {1}


@pytest.mark.parametrize("seed", [0, 1, 2**31, 2**62 + 5])
def test_keys_fit_in_32_bits(seed: int) -> None:
    keys = row_keys(torch.tensor([seed] * 4), torch.tensor([0, 1, 2, 10**6]))
    assert int(keys.min()) >= 0 and int(keys.max()) < 2**32
    assert len(set(keys.tolist())) == 4
    assert not math.isnan(float(keys.double().mean()))
