"""oneDNN's cache of compiled products, emptied when a base goes: a product compiled for that
base's shapes (each batch size a new one) would otherwise stay past its runs. torch exports no
oneDNN function, so the two C calls are found by name in libtorch_cpu's own symbol table."""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

_SET, _GET = "dnnl_set_primitive_cache_capacity", "dnnl_get_primitive_cache_capacity"
# An exported function of the same library: where the dynamic linker puts it proves that the
# symbol table's addresses, moved by the library's load address, are where the code runs.
_WITNESS = "_ZN2at15set_num_threadsEi"
_RTLD_DI_LINKMAP = 2
_SHT_SYMTAB, _STT_FUNC = 2, 2
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_size_t), ("l_name", ctypes.c_char_p)]


class _Calls(NamedTuple):
    set_capacity: Callable[[int], int]  # oneDNN's status: 0 done
    get_capacity: Callable[[Any], int]  # into an int's pointer


@functools.cache
def _capacity_calls() -> _Calls | None:
    """oneDNN's set and get of the cache's capacity, or None where they cannot be found
    safely (no libtorch_cpu, no symbol table, not an ELF64 little-endian file)."""
    try:
        import torch

        path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
        if not path.is_file():
            return None
        library = ctypes.CDLL(str(path))  # already loaded: the same handle, nothing new runs
        loaded_at = _load_address(library)
        found = _function_symbols(path, (_SET, _GET, _WITNESS))
        if len(found) != 3:
            return None
        witness = ctypes.cast(getattr(library, _WITNESS), ctypes.c_void_p).value
        if witness != loaded_at + found[_WITNESS]:
            return None
        set_capacity = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(loaded_at + found[_SET])
        get_capacity = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(
            loaded_at + found[_GET]
        )
    except (OSError, AttributeError, IndexError, ValueError, struct.error) as exc:
        log.debug("oneDNN's cache cannot be reached: %s", exc)
        return None
    return _Calls(set_capacity, get_capacity)


def _load_address(library: ctypes.CDLL) -> int:
    """Where the dynamic linker loaded `library` (its link map's `l_addr`)."""
    dlinfo = ctypes.CDLL(None).dlinfo  # glibc (in libc from 2.34, before in libdl, loaded)
    link_map = ctypes.POINTER(_LinkMap)()
    if dlinfo(ctypes.c_void_p(library._handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0:
        raise OSError("dlinfo failed")
    return int(link_map.contents.l_addr)


def _function_symbols(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """The addresses (before loading) of the functions named `names` in the ELF64 file's
    symbol table: each name's string is found in the string table, then its symbol."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as image:
        if image[:6] != b"\x7fELF\x02\x01":
            raise ValueError("not a little-endian ELF64 file")
        (sections_at,) = struct.unpack_from("<Q", image, 0x28)
        entry_size, count = struct.unpack_from("<HH", image, 0x3A)
        headers = [_SECTION.unpack_from(image, sections_at + i * entry_size) for i in range(count)]
        symtab = next((h for h in headers if h[1] == _SHT_SYMTAB), None)
        if symtab is None:
            return {}
        strtab = headers[symtab[6]]
        return {
            name: value
            for name in names
            if (value := _symbol_value(image, name, symtab, strtab)) is not None
        }


def _symbol_value(image: mmap.mmap, name: str, symtab: tuple, strtab: tuple) -> int | None:
    names_start, names_end = strtab[4], strtab[4] + strtab[5]
    table_start, table_end = symtab[4], symtab[4] + symtab[5]
    wanted = name.encode() + b"\0"
    at = image.find(wanted, names_start, names_end)
    while at != -1:  # every place the name's bytes end a string (a longer name may end so)
        key = struct.pack("<I", at - names_start)
        hit = image.find(key, table_start, table_end)
        while hit != -1:
            if (hit - table_start) % _SYMBOL.size == 0:
                _, info, _, section, value, _ = _SYMBOL.unpack_from(image, hit)
                if info & 0xF == _STT_FUNC and section != 0 and value:
                    return int(value)
            hit = image.find(key, hit + 1, table_end)
        at = image.find(wanted, at + 1, names_end)
    return None


def capacity() -> int | None:
    """The cache's capacity in products, or None where it cannot be reached."""
    calls = _capacity_calls()
    if calls is None:
        return None
    value = ctypes.c_int()
    return value.value if calls.get_capacity(ctypes.pointer(value)) == 0 else None


def empty() -> bool:
    """Drop every compiled product (the capacity to 0 and back): the next product of each shape
    compiles again. False where the cache cannot be reached."""
    calls = _capacity_calls()
    kept = capacity()
    if calls is None or kept is None:
        return False
    return calls.set_capacity(0) == 0 and calls.set_capacity(kept) == 0
