"""A sampler that writes what a test says (and remembers the prompts it was shown), and a chat
template with Hermes's tool format, for tests of what the face and /v1 make of a model's text."""

from __future__ import annotations

from typing import Any

import numpy as np
from tinker import types

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}"
    '{% endfor %}</tools>\nCall a tool as <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    '{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": '
    '"{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{% endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


class Scripted:
    """A sampler that writes what a test says, and remembers what it was shown."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        self.tokenizer, self.text = tokenizer, text
        self.prompts: list[str] = []

    async def sample(self, prompt: Any, num_samples: int, sampling_params: Any, **_: Any) -> Any:
        self.prompts.append(self.tokenizer.decode(prompt.to_ints()))
        tokens = list(self.tokenizer.encode(self.text, add_special_tokens=False)) + [
            self.tokenizer.eos_token_id
        ]
        sequence = types.SampledSequence(
            stop_reason="stop",
            sequence_id="scripted",
            tokens_np=np.asarray(tokens, dtype=np.int32),
            logprobs_np=np.full(len(tokens), -0.5, dtype=np.float32),
        )
        return types.SampleResponse(sequences=[sequence] * num_samples)
