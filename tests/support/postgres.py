"""A real, throwaway PostgreSQL server for tests: one temp folder, one loopback port, trust auth.

Import the fixtures with `from tests.support.postgres import postgres, postgres_url`.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.support.live_server import free_port

SUPERUSER = "postgres"
DATABASE = "rlcs"
# A database name we are willing to put in a URL without quoting.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def find_bindir() -> Path | None:
    """The folder holding both `initdb` and `postgres`: the one on PATH first, else the newest."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        # /usr/local/bin/initdb links into /usr/lib/postgresql/<v>/bin; `postgres` sits beside it.
        candidates.append(Path(on_path).resolve().parent)
    versioned = glob.glob("/usr/lib/postgresql/*/bin")
    versioned.sort(key=lambda p: int(v) if (v := Path(p).parent.name).isdigit() else 0)
    candidates += [Path(p) for p in reversed(versioned)]
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres")):
            return bindir
    return None


def child_pids(parent: int) -> list[int]:
    """Pids of the live processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # Fields after the parenthesised command (which may hold spaces): state, ppid, ...
        if int(stat.rpartition(")")[2].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class PostgresServer:
    """`postgres` on 127.0.0.1:<free port> with its data and socket under one temp folder."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.port = 0
        self.root: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        # initdb refuses to run as root, so as root every server process runs as `postgres`.
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            account = pwd.getpwnam(SUPERUSER)  # KeyError when there is no such user
            self._as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            self._owner = (account.pw_uid, account.pw_gid)
        else:
            self._owner = (os.geteuid(), os.getegid())

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the `rlcs` database."""
        return self.url_for(DATABASE)

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def log(self) -> str:
        """What the server wrote to stderr so far (for failure messages)."""
        path = self.root / "postgres.log" if self.root else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self, timeout: float = 60.0) -> PostgresServer:
        if self.bindir is None:
            raise RuntimeError("PostgreSQL binaries (initdb, postgres) not found")
        if self.proc is not None:
            return self
        try:
            self.root = Path(tempfile.mkdtemp(prefix="rlcs-pg-"))
            os.chown(self.root, *self._owner)
            self._run([str(self.bindir / "initdb"), *self._initdb_args()], timeout=timeout)
            # The free port may be taken by someone else before postgres binds it; then retry.
            for _ in range(3):
                self.port = free_port()
                if self._launch(timeout):
                    break
            else:
                raise RuntimeError(f"postgres found no free port:\n{self.log[-4000:]}")
            self._execute("postgres", f'CREATE DATABASE "{DATABASE}"')
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT); if it hangs, SIGKILL it and its children. Remove the folder."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Postgres children call setsid(), so no process group holds them all. A stopped
                # postmaster forks nothing new, and until it is reaped its children's pids
                # cannot be reused: kill them, then it.
                os.kill(proc.pid, signal.SIGSTOP)
                for pid in child_pids(proc.pid):
                    _kill(pid)
                proc.kill()
                proc.wait()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def new_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh name when none is given) and return its URL."""
        name = name or f"test_{next(self._names)}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"database name {name!r}: use lowercase letters, digits, _")
        # template0: never inherits anything a test may have put into template1.
        self._execute("postgres", f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url_for(name)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _initdb_args(self) -> list[str]:
        assert self.root is not None
        return [
            "--pgdata",
            str(self.root / "data"),
            "--username",
            SUPERUSER,
            "--auth=trust",  # only loopback TCP and our private socket folder can reach it
            "--encoding=UTF8",
            "--locale=C",  # no dependence on which locales the machine has
            "--no-sync",  # a throwaway cluster need not survive a power cut
            "--no-instructions",
        ]

    def _env(self) -> dict[str, str]:
        # A small, fixed environment: no PG* variables of the caller leak in.
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}

    def _run(self, argv: list[str], timeout: float) -> None:
        done = subprocess.run(
            argv,
            cwd=self.root,  # the postgres user may not be able to enter the caller's folder
            env=self._env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
            **self._as,
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"{argv[0]} exited {done.returncode}:\n{output}")

    def _launch(self, timeout: float) -> bool:
        """Start the postmaster and wait until it accepts connections; False if it died early."""
        import psycopg  # the optional `postgres` extra; postgres_or_skip checks for it

        assert self.root is not None
        sockets = self.root / "socket"
        sockets.mkdir(exist_ok=True)
        os.chown(sockets, *self._owner)
        argv = [
            str(self.bindir / "postgres"),
            "-D",
            str(self.root / "data"),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={sockets}",
            # Speed over durability: the data dies with the test session anyway.
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
        # The postmaster itself is our child (pg_ctl would detach it), so stop() can wait for it
        # and find its children; its own session keeps our terminal's signals away from it.
        with (self.root / "postgres.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._as,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "already in use" not in self.log:
                    raise RuntimeError(f"postgres exited {self.proc.returncode}:\n{self.log}")
                self.proc = None
                return False
            try:
                self._execute("postgres", "SELECT 1")
                return True
            except psycopg.OperationalError:  # starting up, or not listening yet
                time.sleep(0.1)
        raise RuntimeError(f"postgres not ready within {timeout}s:\n{self.log[-4000:]}")

    def _execute(self, database: str, statement: str) -> None:
        import psycopg  # the optional `postgres` extra; postgres_or_skip checks for it

        # CREATE DATABASE cannot run inside a transaction, hence autocommit.
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            dbname=database,
            autocommit=True,
            connect_timeout=5,
        ) as conn:
            conn.execute(statement.encode())  # bytes: the statement is built, not a literal


def postgres_or_skip() -> PostgresServer:
    """A started server, or skip the test when this machine cannot run one."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed (pip install -e '.[postgres]')")
    if find_bindir() is None:
        pytest.skip("PostgreSQL binaries (initdb, postgres) not found")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            pytest.skip(f"running as root and there is no {SUPERUSER!r} user to run initdb as")
    return PostgresServer().start()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One server for the whole test session, stopped at its end."""
    server = postgres_or_skip()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A URL of a fresh, empty database of the session's server."""
    return postgres.new_database()
