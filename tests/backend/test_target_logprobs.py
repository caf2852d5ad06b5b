"""Training logprobs computed at the targets only, in checkpointed chunks, equal those of the
full logits, and so do their gradients."""

from __future__ import annotations

import numpy as np
import torch

from runners.engine.train import forward
from tests.backend.test_local_backend import ce_batch


def _full_logits_logprobs(model, data) -> list[np.ndarray]:
    out = []
    with torch.no_grad():
        for datum in data:
            ids = torch.tensor([datum.model_input.to_ints()], device=model.device)
            targets = datum.loss_fn_inputs["target_tokens"].to_torch().to(model.device)
            logits = model(input_ids=ids).logits[0].float()
            picked = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
            out.append(picked.cpu().numpy())
    return out


def _grads(trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer._host.params.items() if p.grad is not None}


def test_chunked_target_logprobs_equal_full_logits(trainer, monkeypatch):
    model = trainer._host.model
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a non-zero adapter, so the LoRA path counts
        for p in trainer._host.params.values():
            p.add_(torch.randn(p.shape, generator=generator).to(p.device) * 0.05)
    data = ce_batch(trainer)
    want = _full_logits_logprobs(model, data)

    whole = trainer.forward_backward(data, "cross_entropy").result()
    whole_grads = _grads(trainer)
    for p in trainer._host.params.values():
        p.grad = None
    # Chunks of 3 rows cut across datums and micro-batches.
    monkeypatch.setattr(forward, "LOGIT_CHUNK_ROWS", 3)
    chunked = trainer.forward_backward(data, "cross_entropy").result()
    chunked_grads = _grads(trainer)

    for out in (whole, chunked):
        for record, expected in zip(out.loss_fn_outputs, want, strict=True):
            np.testing.assert_allclose(record["logprobs"].to_numpy(), expected, atol=1e-5)
    assert whole_grads.keys() == chunked_grads.keys() and whole_grads
    # Same sums in another order: float32 rounding, relative to the largest gradient entry.
    for name, grad in whole_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-5 * scale, rtol=1e-4)
