"""The framework table (core/frameworks.py): every entry's import paths name what they say."""

from __future__ import annotations

import inspect

import pytest

from core.frameworks import FRAMEWORKS, Framework, load
from runners.train.run_base import RunnerBase


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_framework_names_a_trainer_config_describer_and_job_that_exist(
    name: Framework,
) -> None:
    entry = FRAMEWORKS[name]
    assert entry.name == name
    assert issubclass(load(entry.trainer), RunnerBase)
    assert callable(load(entry.describe))
    for path in (entry.run_config, entry.inference):
        if path is not None:
            assert load(path) is not None, path
    if entry.inspect_script is not None:
        assert entry.inspect_script.is_file()
        assert entry.python_setting and entry.python_needs
    if entry.inference is not None:  # built by the inference client with these, by position
        params = list(inspect.signature(load(entry.inference)).parameters)
        assert params == ["settings", "job", "sampler", "tokenizer", "context"]
