"""Test inference (`POST /test/inference`) and the client side of the inference worker process
that answers it (and `/v1`)."""
