"""`rlctl db upgrade`: bring the database named by RLCS_DATABASE_URL (or the default SQLite
file) to the newest schema, as the server does at start-up. It runs the server side's own tool
(`python -m core.schema upgrade`) where rlctl runs: the CLI itself only speaks HTTP."""

from __future__ import annotations

import argparse
import subprocess
import sys

from cli.client import Client
from cli.exits import CliError


def upgrade(_client: Client, args: argparse.Namespace) -> int:
    done = subprocess.run([sys.executable, "-m", "core.schema", "upgrade"], check=False)
    if done.returncode != 0:
        raise CliError("the upgrade failed (see above)", code=done.returncode)
    return 0
