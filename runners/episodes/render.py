"""Observation text to prompt tokens, and the token ids that end a model's turn."""

from __future__ import annotations

from typing import Any


class Renderer:
    """Templates an observation as one user turn (chat template) or passes it through (plain)."""

    def __init__(self, tokenizer: Any, template: str = "chat", system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.template = template if getattr(tokenizer, "chat_template", None) else "plain"
        self.system_prompt = system_prompt

    def prompt_text(self, observation: str) -> str:
        if self.template == "plain":
            return observation
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": observation})
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def prompt_tokens(self, observation: str) -> list[int]:
        return list(self.tokenizer.encode(self.prompt_text(observation), add_special_tokens=False))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def stop_token_ids(self) -> list[int]:
        """End-of-turn ids: EOS plus the chat end marker where the vocabulary has one."""
        ids: set[int] = set()
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, int):
            ids.add(eos)
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            token_id = self.tokenizer.convert_tokens_to_ids(marker)
            unk = self.tokenizer.unk_token_id
            if isinstance(token_id, int) and token_id >= 0 and token_id != unk:
                ids.add(token_id)
        return sorted(ids)
