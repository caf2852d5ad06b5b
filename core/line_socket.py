"""One JSON message per line over a Unix stream socket, either end: `LineSocket` wraps a connected
socket (a client's, or one the listening side accepted): messages out from any thread, each
line in validated as its protocol's and handed to `on_message` on a reading thread, `on_end`
once the other side is gone. The listening side admits its own user only (the socket file is
0600 in a 0700 folder, and each peer's uid is checked).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

log = logging.getLogger(__name__)
In = TypeVar("In")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class LineSocket(Generic[In]):
    def __init__(self, sock: socket.socket, reads: TypeAdapter[In], name: str) -> None:
        self.name = name  # in words, for logs: "the engine host", "run r-1"
        self._sock = sock
        self._reads = reads
        self._write_lock = threading.Lock()
        self._reader = sock.makefile("r", encoding="utf-8", newline="\n")
        self._closed = False

    @classmethod
    def connect(
        cls, path: Path, reads: TypeAdapter[In], name: str, timeout: float = 10.0
    ) -> LineSocket[In]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError:
            sock.close()
            raise
        sock.settimeout(None)
        return cls(sock, reads, name)

    def peer_pid(self) -> int:
        pid, _uid, _gid = _PEERCRED.unpack(
            self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        return int(pid)

    def send(self, message: BaseModel) -> bool:
        """One message, from any thread; False once the other side is gone."""
        data = (message.model_dump_json() + "\n").encode()
        with self._write_lock:
            try:
                self._sock.sendall(data)
            except OSError:
                return False
        return True

    def read_one(self, timeout: float) -> In | None:
        """The next message, read here (a handshake, before `serve`); None at its end."""
        self._sock.settimeout(timeout)
        try:
            line = self._reader.readline()
        finally:
            self._sock.settimeout(None)
        return self._reads.validate_json(line) if line.strip() else None

    def serve(
        self,
        on_message: Callable[[In], None],
        on_end: Callable[[], None],
        invalid: Callable[[str, ValidationError], None] | None = None,
    ) -> None:
        """Read on a thread of its own: each line to `on_message` (one that is not the
        protocol's to `invalid`, or logged), then `on_end` once the other side is gone."""
        threading.Thread(
            target=self._read, args=(on_message, on_end, invalid), daemon=True, name=self.name
        ).start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self._reader.close()  # the socket's file is only let go with its reader's
        except OSError:
            pass

    def _read(
        self,
        on_message: Callable[[In], None],
        on_end: Callable[[], None],
        invalid: Callable[[str, ValidationError], None] | None,
    ) -> None:
        try:
            for line in self._reader:
                if not line.strip():
                    continue
                try:
                    message = self._reads.validate_json(line)
                except ValidationError as exc:
                    if invalid is not None:
                        invalid(line, exc)
                    else:
                        log.warning("%s sent a line not of its protocol: %.200s", self.name, line)
                    continue
                try:
                    on_message(message)
                except Exception:  # the reading goes on: its end is what reports a death
                    log.exception("%s: handling a message failed", self.name)
        except (OSError, ValueError):
            pass  # the socket closed under the reader
        finally:
            on_end()


def listen(path: Path) -> socket.socket:
    """A listening socket at `path` that only this user can reach (a stale file is replaced:
    the caller holds the lock that makes it the only one listening there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def same_user(sock: socket.socket) -> bool:
    """Whether the peer of an accepted connection runs as this process's user."""
    _pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return bool(uid == os.getuid())
