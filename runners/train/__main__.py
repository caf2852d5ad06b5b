"""`python -m runners.train`."""

import sys

from runners.train.loop import main

sys.exit(main())
