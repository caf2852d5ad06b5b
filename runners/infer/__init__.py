"""`python -m runners.infer`: the inference worker, kept warm by the server; answers test inference
and chat requests one JSON line at a time."""
