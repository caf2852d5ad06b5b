"""`python -m runners.train --run-dir DIR`: the training process. The RL loop (`loop.py`),
advantages, datums, and what it reports to the database and W&B."""
