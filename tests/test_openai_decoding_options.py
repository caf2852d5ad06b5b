"""vLLM's min_tokens and ignore_eos on /v1/chat/completions: checked against the token limit,
and refused, naming the field, for a model the hosted Tinker backend serves (its sampler has
neither). Through the real schema and the service's check; the live route is covered in
tests/test_openai_compat.py."""

from __future__ import annotations

import pytest

from server.errors import InvalidValue
from server.openai_compat.chat import check_decoding_options
from server.openai_compat.chat_models import Target
from server.openai_compat.schemas import ChatCompletionIn

LOCAL = Target("tiny-random", "tiny-random", None, "local")
HOSTED = Target("r-0000abcd", "Qwen/Qwen3-8B", "tinker://run/sampler_weights/1", "tinker")


def body(**fields) -> ChatCompletionIn:
    return ChatCompletionIn.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_the_local_backend_takes_both() -> None:
    check_decoding_options(body(max_tokens=8, min_tokens=8, ignore_eos=True), LOCAL)
    check_decoding_options(body(min_tokens=512), LOCAL)  # the default limit is 512


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 8, "min_tokens": 9}, "min_tokens"),
        ({"max_completion_tokens": 8, "min_tokens": 9}, "min_tokens"),
        ({"min_tokens": 513}, "min_tokens"),
    ],
)
def test_min_tokens_beyond_the_limit_is_refused(fields, param) -> None:
    with pytest.raises(InvalidValue) as caught:
        check_decoding_options(body(**fields), LOCAL)
    assert caught.value.extra["param"] == param and "at most max_tokens" in caught.value.detail


@pytest.mark.parametrize("fields", [{"min_tokens": 4}, {"ignore_eos": True}])
def test_a_hosted_model_refuses_them_by_name(fields) -> None:
    name = next(iter(fields))
    with pytest.raises(InvalidValue) as caught:
        check_decoding_options(body(**fields), HOSTED)
    assert caught.value.extra["param"] == name
    assert caught.value.detail.startswith(f"{name}: the tinker backend")


def test_zero_and_false_are_no_request_at_all() -> None:
    check_decoding_options(body(min_tokens=0, ignore_eos=False), HOSTED)
