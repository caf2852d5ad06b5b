"""Import a library without letting it change the host's logging or global random state:
`import gem` calls logging.basicConfig(level=INFO); importing reasoning-gym draws from `random`."""

from __future__ import annotations

import importlib
import logging
import random
import sys
import threading
from types import ModuleType

_lock = threading.Lock()


def import_quietly(name: str) -> ModuleType:
    """Import `name`; the root logger's handlers and level and the global RNGs are kept."""
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module  # fully imported already (a module being imported is not)
    with _lock:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        state = random.getstate()
        numpy = sys.modules.get("numpy")
        numpy_state = numpy.random.get_state() if numpy is not None else None
        try:
            return importlib.import_module(name)
        finally:
            for handler in root.handlers[:]:
                if handler not in handlers:
                    root.removeHandler(handler)
            for handler in handlers:
                if handler not in root.handlers:
                    root.addHandler(handler)
            root.setLevel(level)
            random.setstate(state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)
