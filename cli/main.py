"""`rlctl` entry point: parse the command line, call the handler, turn errors into exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from cli.client import Client
from cli.exits import INTERRUPTED, OK, CliError
from cli.parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on a usage error, as argparse does
    try:
        with Client.from_env(args.url, args.timeout) as client:
            return args.func(client, args)
    except CliError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"rlctl: error: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`rlctl runs logs R | head`): stop quietly, as cat does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK


if __name__ == "__main__":
    sys.exit(main())
