"""Environments: base classes and the built-in ones. Files here are discovered by source scan."""
