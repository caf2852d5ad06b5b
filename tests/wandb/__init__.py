"""Tests of reading run metrics from W&B, against the loopback stand-in."""
