"""`python -m runners.export`."""

import sys

from runners.export.job import main

sys.exit(main())
