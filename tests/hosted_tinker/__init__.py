"""The hosted Tinker service as our runner and server use it: the real tinker SDK against a
loopback stand-in that speaks its wire format (our own Tinker API is tests/tinker_api)."""
