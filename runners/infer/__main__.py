"""`python -m runners.infer`: the inference client (main.py)."""

import sys

from runners.infer.main import main

sys.exit(main())
