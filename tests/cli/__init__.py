"""Tests of the `rlctl` command-line client."""
