"""Issue 55's spike, not a feature: FSDP2 (`fully_shard` per layer) with LoRA on 2 gloo ranks on
the CPU against one process, and FSDP2's per-rank memory for Qwen2.5 shapes from meta tensors.
Run: `OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.fsdp2_spike` (docs/scale-out.md)."""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GB = 1e9  # the note's unit (notes/multi-gpu.md 3.1: 72.7B params x 2 B = 145.4 GB)
PRODUCTS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_STATE_BYTES = 16  # fp32 LoRA: the parameter, its gradient, Adam's exp_avg and exp_avg_sq
REDUCTIONS = ("sum", "avg", "sum-root")
Trace = list[dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Shape:
    """A Qwen2.5 model's shape (notes/multi-gpu.md 3.1); head dim 128."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    kv: int  # the k and v projections' width
    note_shard_gb: float  # the note's bf16 base shard per GPU at N=8
    vocab: int = 152064


SHAPES = [
    Shape("Qwen2.5-7B", 3584, 18944, 28, 512, 1.9),
    Shape("Qwen2.5-32B", 5120, 27648, 64, 1024, 8.1),
    Shape("Qwen2.5-72B", 8192, 29568, 80, 1024, 18.2),
]


@dataclass(frozen=True)
class Parity:
    """Part a: FSDP2 on `world` gloo ranks, each on its share of the datums, against one process
    on all of them (`*_max_diff`) and against one process summing the ranks' shares (`split_`)."""

    reduction: str  # sum, avg (FSDP2's default) or sum-root (see `shard`)
    base_dtype: str
    grad_max_diff: float  # LoRA gradients after each backward, max |FSDP2 - one process|
    weight_max_diff: float  # LoRA weights after each AdamW step
    split_weight_max_diff: float
    base_share: list[float]  # each rank's share of the frozen base's bytes
    swaps_seen: dict[str, bool]  # whether a forward sees an adapter put in place each way
    seconds: float  # sharding and training, rank 0


@dataclass(frozen=True)
class Memory:
    """Part b: what each of `world` ranks holds for one shape under FSDP2 (bytes)."""

    shape: str
    base_params: int
    lora_params: int
    base_shard: int  # bf16 base, this rank's shard as fully_shard made it (fake group, rank 0)
    base_shard_arith: int  # the same from the meta numels: ceil(dim 0 / world) rows of each
    lora_state_shard: int  # fp32 LoRA + grad + Adam, sharded like the base
    root_gathered: int  # the root group (embeddings, final norm, unembed) all-gathered
    layer_gathered: int  # one decoder layer all-gathered (base + LoRA)
    note_shard_gb: float

    @property
    def resident(self) -> int:
        """Shards + the root group + two layers (one computing, one prefetched), before
        activations: the root stays gathered from forward to backward."""
        return (
            self.base_shard + self.lora_state_shard + self.root_gathered + 2 * self.layer_gathered
        )


def tiny_config(layers: int) -> PretrainedConfig:
    """A Llama-shaped config small enough for 2 CPU ranks."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def qwen_config(shape: Shape) -> PretrainedConfig:
    """Qwen2 (Llama with q/k/v biases) at one of the note's shapes."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.hidden // 128,
        num_key_value_heads=shape.kv // 128,
        tie_word_embeddings=False,
    )


def lora_model(
    config: PretrainedConfig, seed: int, base_dtype: torch.dtype, rank: int, targets: list[str]
) -> nn.Module:
    """A causal LM from random weights in `base_dtype`, frozen, with float32 LoRA adapters on
    `targets` (peft keeps adapters float32 over a bf16 base)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(base_dtype)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets)
    with warnings.catch_warnings():  # peft asks transformers 5 a name it deprecates
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        return get_peft_model(model, lora)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks, each its own FSDP2 group."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def shard(model: nn.Module, mesh: DeviceMesh, reduction: str) -> None:
    """`fully_shard` each decoder layer, then the root.

    "avg" leaves FSDP2's default: gradients averaged over ranks. "sum" sets a divide factor of 1
    and SUM-only collectives on every FSDP module: each setter reaches only its own module's
    parameter group, and gloo refuses the PREMUL_SUM a factor of 1 alone asks for. "sum-root"
    sets them on the root alone (which holds no LoRA parameter here)."""
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if reduction == "avg":
        return
    for module in [model] if reduction == "sum-root" else list(model.modules()):
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def datums(count: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """`count` random token sequences of `length`, the same in every process."""
    return torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(seed))


def sum_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy SUMMED over every token of every datum, as our losses are."""
    logits = model(input_ids=tokens[:, :-1]).logits.float()
    targets = tokens[:, 1:].reshape(-1)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets, reduction="sum")


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole tensor: a DTensor's shards gathered from every rank (a collective;
    on one rank `full_tensor` returns the live shard, which the next step would change)."""
    gathered = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return gathered.detach().clone()


def train(model: nn.Module, batches: list[torch.Tensor], steps: int, lr: float) -> Trace:
    """AdamW on the LoRA parameters, each step's gradients summed over `batches`; per step the
    LoRA gradients, then the weights, whole."""
    lora = {name: p for name, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(lora.values(), lr=lr, weight_decay=0.0)
    trace: Trace = []
    for _ in range(steps):
        optimizer.zero_grad()
        for batch in batches:
            sum_loss(model, batch).backward()
        trace.append({f"grad:{n}": whole(p.grad) for n, p in lora.items() if p.grad is not None})
        optimizer.step()
        trace.append({f"weight:{n}": whole(p) for n, p in lora.items()})
    return trace


def swaps_seen(model: nn.Module, tokens: torch.Tensor) -> dict[str, bool]:
    """Does the next forward see another adapter put into the sharded LoRA parameters by
    assigning `.data` (how ModelHost.training swaps clients' adapters today), or by `copy_`?"""
    lora = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        before, kept = sum_loss(model, tokens).item(), [p.data for p in lora]
        for p in lora:
            p.data = torch.full_like(p.data, 0.1)
        by_data = sum_loss(model, tokens).item()
        for p, data in zip(lora, kept, strict=True):
            p.data = data
        for p in lora:
            p.copy_(torch.full_like(p, 0.1))
        by_copy = sum_loss(model, tokens).item()
    return {"data": by_data != before, "copy_": by_copy != before}


def max_diff(a: Trace, b: Trace, kind: str) -> float:
    """Largest |a - b| over the entries of one kind (grad or weight) of two traces."""
    pairs = zip(a, b, strict=True)
    return max((x[k] - y[k]).abs().max().item() for x, y in pairs for k in x if k.startswith(kind))


def local_bytes(model: nn.Module, trainable: bool) -> int:
    """Bytes of this rank's shards of the frozen (or the trainable) parameters."""
    params = [p for p in model.parameters() if p.requires_grad == trainable]
    return sum(p.to_local().numel() * p.element_size() for p in params if isinstance(p, DTensor))


def whole_bytes(params: list[nn.Parameter]) -> int:
    """Bytes of the parameters unsharded (a DTensor's numel is its global one)."""
    return sum(p.numel() * p.element_size() for p in params)


def _rank(
    rank: int, world: int, folder: str, layers: int, steps: int, reductions: list[str], dtype: str
) -> None:
    """One gloo rank: per reduction, FSDP2 training on its share of the datums; rank 0 also
    trains unsharded copies and writes the comparison to `folder`/parity.json."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pairs on 127.0.0.1 only
    store = dist.FileStore(str(Path(folder) / "store"), world)
    timeout = timedelta(seconds=120)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        mesh = init_device_mesh("cpu", (world,))  # "cpu" named: never a GPU's, even on one
        config, base_dtype = tiny_config(layers), getattr(torch, dtype)
        tokens = datums(4 * world, 16, config.vocab_size, seed=2)
        shares = [tokens[r::world] for r in range(world)]

        def model() -> nn.Module:
            return lora_model(config, seed=1, base_dtype=base_dtype, rank=4, targets=PRODUCTS)

        whole_batch = train(model(), [tokens], steps, lr=1e-2) if rank == 0 else []
        split = train(model(), shares, steps, lr=1e-2) if rank == 0 else []
        results = []
        for reduction in reductions:
            started = time.perf_counter()
            fsdp = model()
            base = whole_bytes([p for p in fsdp.parameters() if not p.requires_grad])
            shard(fsdp, mesh, reduction)
            trace = train(fsdp, [shares[rank]], steps, lr=1e-2)
            seconds = time.perf_counter() - started
            base_share: list[float] = [0.0] * world
            dist.all_gather_object(base_share, local_bytes(fsdp, trainable=False) / base)
            seen = swaps_seen(fsdp, shares[rank])
            if rank == 0:
                results.append(
                    Parity(
                        reduction=reduction,
                        base_dtype=dtype,
                        grad_max_diff=max_diff(trace, whole_batch, "grad"),
                        weight_max_diff=max_diff(trace, whole_batch, "weight"),
                        split_weight_max_diff=max_diff(trace, split, "weight"),
                        base_share=base_share,
                        swaps_seen=seen,
                        seconds=seconds,
                    )
                )
        if rank == 0:
            (Path(folder) / "parity.json").write_text(json.dumps([asdict(r) for r in results]))
    finally:
        dist.destroy_process_group()


def parity(
    layers: int = 2,
    steps: int = 3,
    reductions: tuple[str, ...] = ("sum",),
    dtype: str = "float32",
    world: int = 2,
) -> list[Parity]:
    """Part a: FSDP2 with LoRA on `world` gloo ranks (spawned processes), once per reduction;
    the ranks meet in a FileStore in a temporary folder."""
    with tempfile.TemporaryDirectory() as folder:
        args = (world, folder, layers, steps, list(reductions), dtype)
        mp.spawn(_rank, args=args, nprocs=world, join=True)
        return [Parity(**r) for r in json.loads((Path(folder) / "parity.json").read_text())]


def padded_bytes(param: nn.Parameter, world: int) -> int:
    """What one rank allocates for `param` under FSDP2's dim-0 sharding: ceil(rows / world)
    rows (the last rank's shard is padded up to that)."""
    rows = param.shape[0]
    return math.ceil(rows / world) * (param.numel() // rows) * param.element_size()


def memory(shape: Shape, mesh: DeviceMesh, lora_rank: int = 32) -> Memory:
    """One shape on the meta device (bf16 base, fp32 LoRA on every product and the unembed),
    `fully_shard` per layer and root on `mesh` (a fake process group: no data, no collectives)."""
    world = mesh.size()
    with torch.device("meta"):
        config = qwen_config(shape)
        model = lora_model(config, 0, torch.bfloat16, lora_rank, [*PRODUCTS, "lm_head"])
    shard(model, mesh, "sum")
    layers = decoder_layers(model)
    layer_params = {id(p) for layer in layers for p in layer.parameters()}
    frozen = [p for p in model.parameters() if not p.requires_grad]
    lora = [p for p in model.parameters() if p.requires_grad]
    return Memory(
        shape=shape.name,
        base_params=sum(p.numel() for p in frozen),
        lora_params=sum(p.numel() for p in lora),
        base_shard=local_bytes(model, trainable=False),
        base_shard_arith=sum(padded_bytes(p, world) for p in frozen),
        lora_state_shard=local_bytes(model, trainable=True) // 4 * LORA_STATE_BYTES,
        root_gathered=whole_bytes([p for p in model.parameters() if id(p) not in layer_params]),
        layer_gathered=max(whole_bytes(list(layer.parameters())) for layer in layers),
        note_shard_gb=shape.note_shard_gb,
    )


def memory_table(world: int = 8) -> list[Memory]:
    """Part b: every shape at `world` ranks, seen from rank 0 of a fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        return [memory(shape, mesh) for shape in SHAPES]
    finally:
        dist.destroy_process_group()


def print_parity(results: list[Parity]) -> None:
    print(
        "| reduction | base | LoRA grads max diff | LoRA weights max diff | vs split"
        " | base share per rank | s |"
    )
    print("|---|---|---:|---:|---:|---|---:|")
    for r in results:
        share = " / ".join(f"{s:.1%}" for s in r.base_share)
        print(
            f"| {r.reduction} | {r.base_dtype} | {r.grad_max_diff:.1e} | {r.weight_max_diff:.1e}"
            f" | {r.split_weight_max_diff:.1e} | {share} | {r.seconds:.1f} |"
        )
    seen = results[0].swaps_seen
    print(f"an adapter put into the sharded LoRA parameters is seen: {seen}")


def print_memory(rows: list[Memory], world: int) -> None:
    print(f"GB = 1e9 bytes per rank, world {world}; LoRA r=32 on q,k,v,o,gate,up,down + unembed")
    print(
        "| shape | base params | bf16 base shard | note, N=8 | LoRA params | LoRA+grad+Adam shard"
        " | root gathered | layer gathered | resident before activations |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        print(
            f"| {m.shape} | {m.base_params / 1e9:.2f}B | {m.base_shard / GB:.2f} GB"
            f" | {m.note_shard_gb} GB | {m.lora_params / 1e6:.0f}M"
            f" | {m.lora_state_shard / GB:.2f} GB | {m.root_gathered / GB:.2f} GB"
            f" | {m.layer_gathered / GB:.2f} GB | {m.resident / GB:.1f} GB |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=["a", "b", "ab"], default="ab")
    parser.add_argument("--layers", type=int, default=2, help="part a's decoder layers")
    parser.add_argument("--world", type=int, default=8, help="part b's ranks")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    out: dict[str, list[dict[str, object]]] = {}
    if "a" in args.part:
        results = parity(args.layers, reductions=REDUCTIONS)
        results += parity(args.layers, reductions=("sum",), dtype="bfloat16")
        print_parity(results)
        out["parity"] = [asdict(r) for r in results]
    if "b" in args.part:
        rows = memory_table(args.world)
        for m in rows:  # fully_shard's own shard against the arithmetic on the meta numels
            assert m.base_shard == m.base_shard_arith, (m.shape, m.base_shard, m.base_shard_arith)
        print_memory(rows, args.world)
        out["memory"] = [{**asdict(m), "resident": m.resident} for m in rows]
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
