"""`python -m runners.engine_host`: the engine host, the one process per var/ folder that holds
the models (issue 43): the local engine's base models, training clients and samplers, shared by
every client on its socket: the server (its Tinker API sessions, /v1 and test inference) and
runs. It speaks core.engine_wire (Tinker operations: core.tinker_wire; inference jobs:
core.infer_wire) and decodes and encodes the SDK's protobuf bodies itself (proto.py), so the
server never imports tinker.
"""
