"""Tests of the Tinker backend: the real tinker SDK against the loopback stand-in."""
