"""Loopback stand-ins for hosted services, speaking their real wire formats (tests only)."""
