"""The mixed-adapter LoRA product alone, on the CPU: which way of applying K adapters to the
rows of one decode step is fastest (it decides the packed model's CPU route).

For each of SmolLM2-135M's product groups (q/k/v, o, gate/up, down) and R rows split evenly
over K rank-8 adapters (rows interleaved, as slots fill), in float32 on one thread (a decode
step's setting below 16 rows), microseconds per call of `y += (x A_k^T) B_k^T` for every row's
own k, against one adapter for all rows (today's batches, the floor):
- `bmm`: rows gathered into [K, R/K, in], two batched products, gathered back;
- `grouped_mm`: rows sorted by adapter, `torch.nn.functional.grouped_mm` over their offsets;
- `segments`: a loop over the K adapters, each with its rows gathered and scattered back.

Then the products as a decode step reads them (`--step`): SmolLM2's 30 layers of the four
groups as the packed model holds them (bf16 base through oneDNN, 8 rank-8 adapter slots), each
group's base product and its rows' updates, every slot's weights read from memory as a step
reads them (not warm in a cache); milliseconds per step, base alone, one adapter for every
row, rows interleaved over 8 adapters: the torch products against the fused kernel
(`runners/engine/sample/lora_rows.py`), which decides `KERNEL_ROWS` in packed_group.py.

Run from the repo root (about a minute each):
    .venv/bin/python -m benchmarks.adapter_products [--step]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from runners.engine.sample.cpu_products import Threads
from runners.engine.sample.lora_rows import kernel
from runners.engine.sample.packed_group import PackedGroup
from runners.engine.sample.row_adapters import RowAdapters, group_rows

# SmolLM2-135M's groups: (name, inputs, outputs, members sharing the input).
GROUPS = (
    ("qkv", 576, 960, 3),
    ("o", 576, 576, 1),
    ("gate_up", 576, 3072, 2),
    ("down", 1536, 576, 1),
)
RANK = 8


def _time(call: Callable[[], object], repeats: int) -> float:
    """Median microseconds of `call` over `repeats` rounds of 20 calls."""
    for _ in range(20):
        call()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(20):
            call()
        rounds.append((time.perf_counter() - start) / 20 * 1e6)
    return statistics.median(rounds)


def routes(
    rows: int, adapters: int, inputs: int, outputs: int, members: int
) -> dict[str, Callable[[], object]]:
    """Each route's call for one group; all compute the same update (checked)."""
    ranks = RANK * members
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inputs, generator=gen)
    a_t = torch.randn(adapters, inputs, ranks, generator=gen) * 0.05
    b_t = torch.randn(adapters, ranks, outputs, generator=gen) * 0.05
    y = torch.zeros(rows, outputs)
    slot = [r % adapters for r in range(rows)]  # interleaved, as rows join slot after slot
    per = -(-rows // adapters)
    gather = torch.zeros(adapters, per, dtype=torch.long)
    back = torch.zeros(rows, dtype=torch.long)
    filled = [0] * adapters
    for r, k in enumerate(slot):
        gather[k, filled[k]] = r
        back[r] = k * per + filled[k]
        filled[k] += 1
    flat = gather.flatten()
    order = torch.tensor(sorted(range(rows), key=lambda r: slot[r]))
    inverse = torch.argsort(order)
    offsets = torch.tensor([sum(filled[: k + 1]) for k in range(adapters)], dtype=torch.int32)
    members_of = [torch.tensor([r for r in range(rows) if slot[r] == k]) for k in range(adapters)]

    def single() -> object:
        return y.add_(torch.mm(torch.mm(x, a_t[0]), b_t[0]))

    def bmm() -> object:
        xs = x.index_select(0, flat).view(adapters, per, inputs)
        d = torch.bmm(torch.bmm(xs, a_t), b_t).view(-1, outputs)
        return y.add_(d.index_select(0, back))

    def grouped() -> object:
        xs = x.index_select(0, order)
        h = F.grouped_mm(xs, a_t, offs=offsets)
        d = F.grouped_mm(h, b_t, offs=offsets)
        return y.add_(d.index_select(0, inverse))

    def segments() -> object:
        for k, index in enumerate(members_of):
            d = torch.mm(torch.mm(x.index_select(0, index), a_t[k]), b_t[k])
            y.index_add_(0, index, d)
        return y

    want = torch.cat([x[r : r + 1] @ a_t[slot[r]] @ b_t[slot[r]] for r in range(rows)])
    for name, call in (("bmm", bmm), ("grouped_mm", grouped), ("segments", segments)):
        y.zero_()
        call()
        assert torch.allclose(y, want, atol=1e-4), name
    return {"one adapter": single, "bmm": bmm, "grouped_mm": grouped, "segments": segments}


def measure(rows_list: list[int], adapters_list: list[int], repeats: int) -> list[dict]:
    torch.set_num_threads(1)
    table = []
    for rows in rows_list:
        for adapters in adapters_list:
            if adapters > rows:
                continue
            totals: dict[str, float] = {}
            for _, inputs, outputs, members in GROUPS:
                for name, call in routes(rows, adapters, inputs, outputs, members).items():
                    totals[name] = totals.get(name, 0.0) + _time(call, repeats)
            table.append({"rows": rows, "adapters": adapters, **totals})
    return table


def step_groups(slots: int, fused: bool, threads: Threads) -> list[PackedGroup]:
    """SmolLM2's 30 layers of product groups in bf16 with `slots` rank-8 adapters loaded."""
    gen = torch.Generator().manual_seed(0)
    built = kernel()
    if fused and built is None:
        raise SystemExit("the fused kernel could not be built here (see the log)")
    groups = []
    for layer in range(30):
        for name, inputs, outputs, members in GROUPS:
            width = outputs // members
            layers = [nn.Linear(inputs, width, bias=False) for _ in range(members)]
            names = [f"{layer}.{name}.{i}" for i in range(members)]
            group = PackedGroup(layers, names, torch.bfloat16, 0, masked=False)
            group.reserve(slots, RANK)
            for slot in range(slots):
                adapter = {
                    n: (
                        torch.randn(RANK, inputs, generator=gen) * 0.05,
                        torch.randn(width, RANK, generator=gen) * 0.05,
                    )
                    for n in names
                }
                group.load(slot, adapter, 2.0)
            group.use_onednn(threads, keep_plain=False)
            if fused:
                assert built is not None
                group.use_kernel(built, threads)
            groups.append(group)
    return groups


def step_report(rows_list: list[int], repeats: int) -> None:
    """Milliseconds per decode step's products: base, one adapter, 8 interleaved; torch
    against the fused kernel (the packed model's thread policy, rounds interleaved, medians)."""
    threads = Threads(torch.get_num_threads())
    routes = {
        "torch": step_groups(8, fused=False, threads=threads),
        "kernel": step_groups(8, fused=True, threads=threads),
    }
    print(f"# ms per step (30 layers x 4 groups), bf16 base, rank 8, {threads.wide} threads")
    print("| rows | base alone | one adapter: torch | kernel | 8 adapters: torch | kernel |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rows in rows_list:
        cells = " | ".join(f"{ms:.1f}" for ms in _step_times(rows, routes, threads, repeats))
        print(f"| {rows} | {cells} |", flush=True)


def _step_times(
    rows: int, routes: dict[str, list[PackedGroup]], threads: Threads, repeats: int
) -> list[float]:
    """Median ms of base, one adapter (torch, kernel), 8 interleaved (torch, kernel)."""
    gen = torch.Generator().manual_seed(rows)
    x = {n: torch.randn(rows, n, generator=gen).bfloat16() for n in (576, 1536)}
    cases = {"base": RowAdapters(torch.full((rows,), -1), False, None, 8)}
    for label, slots in (("one", [0] * rows), ("mixed", [r % 8 for r in range(rows)])):
        index = torch.tensor(slots)
        cases[label] = RowAdapters(index, True, group_rows(slots, [RANK] * 8, index.device), 8)
    calls = [
        (routes["torch"], cases["base"]),
        (routes["torch"], cases["one"]),
        (routes["kernel"], cases["one"]),
        (routes["torch"], cases["mixed"]),
        (routes["kernel"], cases["mixed"]),
    ]
    times: list[list[float]] = [[] for _ in calls]
    for round_ in range(repeats + 2):  # two rounds to warm
        for (groups, adapters), seen in zip(calls, times, strict=True):
            started = time.perf_counter()
            _step(groups, x, adapters, threads)
            if round_ >= 2:
                seen.append((time.perf_counter() - started) * 1e3)
    return [statistics.median(t) for t in times]


def _step(
    groups: list[PackedGroup], x: dict[int, torch.Tensor], rows: RowAdapters, threads: Threads
) -> None:
    threads.narrow(len(rows.index))
    try:
        for group in groups:
            group(x[group.inputs], rows)
    finally:
        threads.end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="4,8,16,32")
    parser.add_argument("--adapters", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--step", action="store_true", help="a decode step's products")
    args = parser.parse_args()
    if args.step:
        step_report([int(r) for r in args.rows.split(",")] + [64, 128], args.repeats)
        return
    report(
        [int(r) for r in args.rows.split(",")],
        [int(k) for k in args.adapters.split(",")],
        args.repeats,
    )


def report(rows: list[int], adapters: list[int], repeats: int) -> None:
    """The table of `measure`, as benchmarks/README.md shows it."""
    threads = torch.get_num_threads()
    try:
        table = measure(rows, adapters, repeats)
    finally:
        torch.set_num_threads(threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, one thread")
    print("# us per layer (q/k/v + o + gate/up + down), rank 8, float32")
    names = ["one adapter", "bmm", "grouped_mm", "segments"]
    print("| rows | K | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for line in table:
        cells = " | ".join(f"{line[n]:.0f}" for n in names)
        print(f"| {line['rows']} | {line['adapters']} | {cells} |")


if __name__ == "__main__":
    main()
