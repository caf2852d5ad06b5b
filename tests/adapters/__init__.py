"""Tests of the environment adapters (GEM, reasoning-gym, OpenReward)."""
