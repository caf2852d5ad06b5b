"""What a GPU can do at best, measured in the same run as the figures it bounds: the copy
bandwidth and the bf16 matrix rate (the ceilings), the memory floor of a decode step, and a
short torch profile of where a region's GPU time goes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # device-to-device copy, bytes read plus bytes written
    bf16_flops: float  # one large bf16 matrix product on random data


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `fn` on the GPU, timed with events after warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def measure_ceilings() -> Ceilings:
    """A 2 GiB copy and an 8192^3 bf16 product (random data: zeros run faster)."""
    ceilings = Ceilings(_copy_rate(2**29), _matmul_rate(8192))
    torch.cuda.empty_cache()
    return ceilings


def _copy_rate(elements: int) -> float:
    source = torch.randn(elements, device="cuda")
    target = torch.empty_like(source)
    seconds = _timed(lambda: target.copy_(source), 10)
    return 2 * source.numel() * source.element_size() / seconds


def _matmul_rate(n: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / _timed(lambda: a @ b, 10)


def kv_bytes_per_token(config: object, dtype_bytes: int = 2) -> int:
    """Keys and values one cached token holds across all layers."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads  # type: ignore[attr-defined]
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads  # type: ignore[attr-defined]
    )
    return 2 * config.num_hidden_layers * heads * head_dim * dtype_bytes  # type: ignore[attr-defined]


def decode_floor_ms(weight_bytes: int, kv_bytes: int, bytes_per_s: float) -> float:
    """The fewest milliseconds a decode step can take: every weight and every cached key and
    value read once at the measured bandwidth (the arithmetic is far below the matrix rate)."""
    return (weight_bytes + kv_bytes) / bytes_per_s * 1e3


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each tensor counted once."""
    seen: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def profile(region: Callable[[], object], label: str, out_dir: Path | None, rows: int = 15) -> None:
    """Run `region` once under the torch profiler; print the kernels and ops that took the
    most GPU time, and save a Chrome trace under `out_dir` when given."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch_profile(activities=activities) as prof:
        started = time.perf_counter()
        region()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - started) * 1e3
    events = prof.key_averages()
    gpu_total = sum(e.self_device_time_total for e in events) / 1e3
    print(
        f"\nprofile: {label} (wall {wall:.1f} ms, profiled; GPU busy {gpu_total:.1f} ms in "
        "all; self time by op)"
    )
    print(events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() else "_" for c in label)[:60]
        prof.export_chrome_trace(str(out_dir / f"trace_{name}.json"))


def device_line() -> str:
    """The GPU, its driver and the CUDA build torch runs on."""
    driver = "unknown"
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return (
        f"{torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}, "
        f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
    )
