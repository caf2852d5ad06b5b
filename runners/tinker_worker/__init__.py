"""`python -m runners.tinker_worker`: the Tinker worker, the process behind the server's Tinker
API (server/tinker_api; issues 28 and 34).

It owns the models: the local engine's training clients and samplers, each base model loaded
once and shared. It speaks core.tinker_wire with the server (server/tinker_api/worker_client.py)
and decodes and encodes the SDK's protobuf bodies itself (proto.py), so the server never
imports tinker.
"""
