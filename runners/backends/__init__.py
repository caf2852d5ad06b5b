"""Training backends sharing one tinker-shaped surface: the hosted tinker SDK and the local one.

Nothing heavy is imported here, so importing a submodule never drags in torch by accident.
"""
