"""Exit codes that scripts can rely on, and the errors that carry them to `main`."""

from __future__ import annotations

OK = 0
SERVER_ERROR = 1  # the server answered with an error status (bad input, not found, conflict)
USAGE = 2  # argparse's own code for a bad command line; we reuse it for bad RLCS_URL
UNREACHABLE = 3  # no answer: connection refused, DNS, timeout, a stream cut short
RUN_FAILED = 4  # `runs watch` / `runs logs --follow` / `runs wait`: the run ended `failed`
WAIT_TIMED_OUT = 5  # `runs wait`, `sweeps wait`: the timeout passed before the condition held
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

EPILOG = """\
exit codes:
  0  success (for `runs watch` and `runs logs --follow`: the run ended succeeded or stopped)
  1  the server answered with an error (4xx: bad input, not found, conflict; 5xx); the
     server's `detail` is printed on stderr with the HTTP status
  2  usage error (bad arguments, bad RLCS_URL)
  3  server unreachable, timed out, or a log stream cut short
  4  `runs watch` / `runs logs --follow` / `runs wait`: the run ended failed
  5  `runs wait` / `sweeps wait`: the timeout passed before the condition held
  130 interrupted (Ctrl-C)

environment:
  RLCS_URL        server address (default http://127.0.0.1:8080)
  RLCS_API_TOKEN  sent as `Authorization: Bearer <token>` when set
"""


class CliError(Exception):
    """A failure with a message for stderr and the exit code it ends the process with."""

    code = SERVER_ERROR

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ApiError(CliError):
    """The server answered with an error status; `detail` is its own explanation."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        head = f"HTTP {status} {reason}".rstrip()
        super().__init__(f"{head}: {detail}")
        self.status = status
        self.detail = detail


class Unreachable(CliError):
    code = UNREACHABLE


class UsageError(CliError):
    code = USAGE
