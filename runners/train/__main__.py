"""`python -m runners.train`."""

import sys

from runners.train import torch_free

torch_free.prepare(sys.argv[1:])  # before anything imports tinker: it decides whether torch loads

from runners.train.loop import main  # noqa: E402

sys.exit(main())
