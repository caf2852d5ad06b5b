"""`python -m runners.export`: write a run's checkpoint as a Hugging Face folder (adapter or
merged), or fetch a Tinker run's weights, in a process of its own."""
