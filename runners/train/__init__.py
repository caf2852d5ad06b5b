"""`python -m runners.train --run-dir DIR`: the training process. The learner (`learner.py`:
advantages, datums, the optimizer step) written once, the drivers around it (our loop in
`loop.py`, the Atropos trainer in runners/atropos), what every run does around its steps
(`run_base.py`), its seeds, and what it reports to the database and W&B."""
