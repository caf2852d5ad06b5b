"""SmolLM2 packs exactly: the packed forward's logits against the trainer's peft model in
float32, with an adapter and without."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.engine.local import LocalServiceClient
from tests.backend.test_packed_model import _check_against_reference, _nudge


@pytest.mark.parametrize("adapter", [True, False], ids=["adapter", "base"])
def test_smollm2_packs_exactly_in_float32(tmp_path: Path, adapter):
    from core.model_names import SMOLLM2, smollm2_is_converted

    models = Path("var/models")
    if not smollm2_is_converted(models):
        pytest.skip("SmolLM2 is not converted here (make install converts it)")
    service = LocalServiceClient(
        checkpoint_dir=tmp_path, models_dir=models, device="cpu", dtype="float32"
    )
    try:
        trainer = service.create_lora_training_client(SMOLLM2, rank=8, seed=0).result()
        _nudge(trainer._host)
        # Logits of about 20 through 30 layers: transformers' own decode step (a cache) and
        # its full forward differ by up to 6e-3 here, so the same bound holds for ours.
        _check_against_reference(trainer._host, adapter, atol=1e-2)
    finally:
        service.close()
