"""`python -m runners.tinker_engine`: the process behind the server's Tinker API (issue 28).

It owns the models: the local backend's training clients and samplers, each base model loaded
once and shared. It speaks JSON lines with the server (server/tinker_api/engine_client.py) and
decodes and encodes the SDK's protobuf bodies itself, so the server never imports tinker.
"""
