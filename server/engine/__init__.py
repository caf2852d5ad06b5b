"""This machine's engine hosts as the server sees them: a connection to each for the Tinker API,
/v1 and test inference, and placement by base model (hosts.py, link.py), and GET /engine (each
host's device, memory, bases, lanes, clients and queues)."""
