"""oneDNN's cache of compiled products, reached through libtorch_cpu's symbol table: the
capacity read is the one the process was started with, and emptying it gives the products'
memory back. Each check runs in a fresh process (oneDNN reads its capacity once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from core.settings import PROJECT_ROOT
from runners.engine.sample.cpu_products import uses_onednn

CHILD = """
import json, sys, psutil, torch
from runners.engine import heap, onednn_cache
torch.set_num_threads(1)
found = {"capacity": onednn_cache.capacity()}
if sys.argv[1] == "products":
    rss = lambda: psutil.Process().memory_info().rss
    weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn(1024, 512).bfloat16(), None)
    def products(rows):
        x = torch.ones(rows, 512).bfloat16()
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    expected = products(3)
    heap.give_back_free_memory()
    before = rss()
    for rows in range(1, 121):
        products(rows)
    heap.give_back_free_memory()
    grown = rss()
    found["emptied"] = onednn_cache.empty()
    heap.give_back_free_memory()
    found.update(grown=grown - before, left=rss() - before, after=onednn_cache.capacity(),
                 same=bool(torch.equal(products(3), expected)))
print(json.dumps(found))
"""


def child(what: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, what],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found: dict = json.loads(done.stdout.splitlines()[-1])
    return found


def test_the_capacity_read_is_the_one_the_process_started_with() -> None:
    assert child("capacity", ONEDNN_PRIMITIVE_CACHE_CAPACITY="37") == {"capacity": 37}
    assert child("capacity", ONEDNN_PRIMITIVE_CACHE_CAPACITY="5") == {"capacity": 5}


@pytest.mark.skipif(
    not uses_onednn(torch.device("cpu"), torch.bfloat16), reason="no native bf16 on this CPU"
)
def test_emptying_gives_the_compiled_products_memory_back() -> None:
    # LRU_CACHE_CAPACITY=1: ideep's own per-thread cache, which would also hold each product
    # (it ends with its thread), keeps one, so what grows is oneDNN's cache alone.
    found = child("products", ONEDNN_PRIMITIVE_CACHE_CAPACITY="128", LRU_CACHE_CAPACITY="1")
    assert found["emptied"] and found["capacity"] == found["after"] == 128
    assert found["same"]  # a product compiles again, to the same result
    assert found["grown"] > 10e6, found  # 120 shapes of products compiled
    assert found["left"] < found["grown"] / 4, found
