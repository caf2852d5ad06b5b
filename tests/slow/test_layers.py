"""Importing every module of runners in a clean interpreter loads nothing of ours from above (it
loads torch and transformers: slow); tests/test_layers.py checks core and environments."""

from __future__ import annotations

import pytest

from tests.test_layers import loads_nothing_from_above


@pytest.mark.parametrize("package", ["runners"])
def test_importing_every_module_loads_nothing_from_above(package: str) -> None:
    loads_nothing_from_above(package)
