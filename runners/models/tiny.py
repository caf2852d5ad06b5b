"""`tiny-random`: a small Llama-shaped model and a byte-level ChatML tokenizer, built in-process.

No download, same weights every time: for tests and for trying the whole stack in seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.model_names import TINY_RANDOM_CONTEXT

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

TINY_SEED = 20240607
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Every byte is one token (ids 0-255), then <|im_end|>, <|endoftext|>, <|im_start|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level alphabet with no merges: any text encodes, and ids never depend on a vocab file.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START],
        model_max_length=TINY_RANDOM_CONTEXT,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(vocab_size: int, eos_token_id: int, pad_token_id: int) -> LlamaForCausalLM:
    """Hidden 64, 2 layers, 4 heads (2 KV heads), tied embeddings like SmolLM2; float32 on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_RANDOM_CONTEXT,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    # A private RNG stream: the weights are fixed and the caller's global RNG is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model.eval()


def build_tiny() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    return model, tokenizer
