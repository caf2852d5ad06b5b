"""Sweeps: many runs from one base config and a grid or list of overrides, validated as a
whole before any run exists, with their results side by side."""
