"""The Tinker SDK's HTTP API (/api/v1), served from the local engine in the engine hosts
(runners/engine_host). README.md draws one call from the SDK's POST to its retrieve_future and
maps the files: the HTTP face (routes, schemas, auth, proto_header), the operations (service,
rest), the hosts' client (worker_client), the sessions and their futures (sessions/), and the
launcher kind the supervisor sees (launcher).
"""
