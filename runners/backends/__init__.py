"""The training surface runs are written against (`surface.py`, shaped like the tinker SDK) and
the two things that provide it: the hosted Tinker SDK and the local engine (`runners.engine`).

Nothing heavy is imported here, so importing a submodule never drags in torch by accident.
"""
