"""Address facts: is a host this machine (loopback)?"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str | None) -> bool:
    """localhost, 127.0.0.0/8, ::1, and IPv4-mapped loopback addresses."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
