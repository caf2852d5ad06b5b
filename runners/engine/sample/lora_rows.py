"""The CPU's fused adapter product (`lora_rows.c`: each row's update from its own slot, bf16
weights, float32 sums, one pass): built with the machine's C compiler at first use into the
user's cache, checked against torch, and called through ctypes. None where it cannot be had."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("lora_rows.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class LoraRows:
    """`add(x, y, a_rows, b_t, slot, used, threads)`: y[r] += (x[r] A_s^T) B_s^T for each row's
    s = slot[r] >= 0."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._add = library.lora_rows_add
        self._add.restype = None
        self._add.argtypes = [_P, _L, _P, _L, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I]

    def add(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        a_rows: torch.Tensor,
        b_t: torch.Tensor,
        slot: torch.Tensor,
        used: int,
        threads: int = 1,
    ) -> None:
        """x [rows, in] and y [rows, out] bf16, contiguous (y updated in place); a_rows
        [slots, width, in] and b_t [slots, width, out] bf16, contiguous; slot [rows] int64 (-1:
        no update); the first `used` ranks of each slot's `width`; blocks of rows shared among
        up to `threads` threads. Checked here: the C side trusts every pointer and size."""
        rows, inputs = x.shape
        slots, width, out = b_t.shape
        if not (
            x.dtype == y.dtype == a_rows.dtype == b_t.dtype == torch.bfloat16
            and slot.dtype == torch.int64
            and y.shape == (rows, out)
            and a_rows.shape == (slots, width, inputs)
            and slot.shape == (rows,)
            and 0 <= used <= width
            and all(t.is_contiguous() and t.device.type == "cpu" for t in (x, y, a_rows, b_t, slot))
        ):
            raise ValueError(
                f"lora_rows: x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}, A "
                f"{tuple(a_rows.shape)}, B^T {tuple(b_t.shape)}, slot {tuple(slot.shape)} "
                f"{slot.dtype}, used {used}: not the shapes, dtypes or layout it takes"
            )
        if rows and used and slots:
            self._add(
                x.data_ptr(), inputs, y.data_ptr(), out, a_rows.data_ptr(), b_t.data_ptr(),
                slot.data_ptr(), rows, inputs, out, width, used, slots, max(1, threads),
            )  # fmt: skip


def default_cache() -> Path:
    """Where built kernels are kept: $XDG_CACHE_HOME/rlcs/kernels (else ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlcs" / "kernels"


def build(cache: Path) -> LoraRows | str:
    """The kernel, built into `cache` unless a build for this source, compiler and CPU is there
    already, and checked against torch; else why not."""
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        return "no C compiler (cc, or $CC) on PATH"
    problem = _private_dir(cache)
    if problem is not None:
        return problem
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_flags()]).encode()
    ).hexdigest()[:16]
    path = cache / f"lora_rows-{key}.so"
    if not path.exists():
        partial = cache / f"lora_rows-{key}.{os.getpid()}.tmp"
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(partial), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            return f"{Path(compiler).name} failed on {SOURCE.name}: {last}"
        os.replace(partial, path)  # whole or absent, whoever else builds it at once
    try:
        kernel = LoraRows(ctypes.CDLL(str(path)), path)
    except OSError as exc:
        return f"could not load {path}: {exc}"
    return _checked(kernel)


@functools.cache
def kernel() -> LoraRows | None:
    """This process's kernel (built once), or None, the reason logged once."""
    built = build(default_cache())
    if isinstance(built, str):
        log.warning("the CPU's fused adapter product is off, the torch products serve: %s", built)
        return None
    return built


def _private_dir(cache: Path) -> str | None:
    """Why `cache` is not a folder only its owner (this user) can write, made if missing."""
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = cache.stat()
    except OSError as exc:
        return f"cannot use {cache}: {exc}"
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{cache} is not this user's alone (a library loaded from it would run here)"
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (-march=native builds for them: a cache shared between machines
    must not hand one machine's build to another)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _checked(kernel: LoraRows) -> LoraRows | str:
    """The kernel if it adds what torch's products add on a small mixed case (3 slots, a row of
    none, ranks below the width, a tail of outputs), within bf16 rounding; else why not."""
    gen = torch.Generator().manual_seed(0)
    rows, inputs, out, slots, width, used = 7, 40, 70, 3, 6, 5
    x = torch.randn(rows, inputs, generator=gen).bfloat16()
    y = torch.randn(rows, out, generator=gen).bfloat16()
    a = (torch.randn(slots, width, inputs, generator=gen) * 0.1).bfloat16()
    b = (torch.randn(slots, width, out, generator=gen) * 0.1).bfloat16()
    slot = torch.tensor([2, 0, -1, 2, 1, 0, 2])
    want = y.double()
    for r, s in enumerate(slot.tolist()):
        if s >= 0:
            h = x[r].double() @ a[s, :used].double().t()
            want[r] += h @ b[s, :used].double()
    got = y.clone()
    kernel.add(x, got, a, b, slot, used)
    error = (got.double() - want).abs().max().item()
    bound = want.abs().max().item() * 2**-7
    if not error <= bound:
        return f"{kernel.path} disagrees with torch (max error {error:.3g}, bound {bound:.3g})"
    return kernel
