"""The mixed-adapter LoRA product alone, on the CPU: which way of applying K adapters to the
rows of one decode step is fastest (it decides the packed model's CPU route).

For each of SmolLM2-135M's product groups (q/k/v, o, gate/up, down) and R rows split evenly
over K rank-8 adapters (rows interleaved, as slots fill), in float32 on one thread (a decode
step's setting below 16 rows), microseconds per call of `y += (x A_k^T) B_k^T` for every row's
own k, against one adapter for all rows (today's batches, the floor):
- `bmm`: rows gathered into [K, R/K, in], two batched products, gathered back;
- `grouped_mm`: rows sorted by adapter, `torch.nn.functional.grouped_mm` over their offsets;
- `segments`: a loop over the K adapters, each with its rows gathered and scattered back.

Run from the repo root (about a minute):
    .venv/bin/python -m benchmarks.adapter_products
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="4,8,16,32")
    parser.add_argument("--adapters", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
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
