"""The real runner with SIGTERM blocked, like a runner on another machine that the server
cannot signal: only the stop request in the database reaches it."""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":
    # Blocked before anything starts a thread (importing the runner may), so every thread
    # inherits the mask and SIGTERM stays pending.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    from runners.train import loop as train

    sys.exit(train.main())
