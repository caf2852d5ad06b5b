"""Every request of core.tinker_wire says which training model and sampler it works on
(model_of, sampler_of) as its fields name them: a new operation cannot be left out."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from core.tinker_wire import Op, Request, model_of, sampler_of

REQUESTS: tuple[type[Op[Any]], ...] = get_args(get_args(Request)[0])


@pytest.mark.parametrize("kind", REQUESTS, ids=lambda kind: kind.__name__)
def test_a_request_names_the_model_and_sampler_its_fields_name(kind: type[Op[Any]]) -> None:
    fields = kind.model_fields
    ids: dict[str, Any] = {name: f"{name}-1" for name in ("model_id", "sampler_id")}
    request = kind.model_construct(**{name: ids[name] for name in ids if name in fields})
    assert model_of(request) == ("model_id-1" if "model_id" in fields else None)
    assert sampler_of(request) == ("sampler_id-1" if "sampler_id" in fields else None)
