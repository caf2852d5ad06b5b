"""The ray lane: runs as jobs on a real Ray head on loopback."""
