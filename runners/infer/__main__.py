"""`python -m runners.infer`."""

import sys

from runners.infer.worker import main

sys.exit(main())
