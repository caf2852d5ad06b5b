"""Who may call: with no token, only clients on this machine, however the server was started
(the documented `uvicorn server.app:app --host 0.0.0.0` included), unless the operator opts out."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.guards.access import remote_peer
from tests.support.live_server import LiveServer


def test_python_m_server_refuses_a_public_bind_without_a_token(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "var", RLCS_HOST="0.0.0.0")
    with pytest.raises(RuntimeError, match="Refusing to listen on 0.0.0.0 without a token"):
        server.start(timeout=20)


@pytest.mark.parametrize(
    ("host", "remote"),
    [
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("testclient", False),  # Starlette's in-process client: not an address off-machine
        (None, False),  # a unix socket
        ("192.0.2.7", True),
        ("10.0.0.2", True),
        ("::ffff:10.0.0.2", True),
        ("fd00::2", True),
    ],
)
def test_remote_peer(host: str | None, remote: bool) -> None:
    assert remote_peer(host) is remote
