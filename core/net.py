"""Address facts: is a host this machine (loopback)?"""

from __future__ import annotations

import ipaddress


def parse_ip(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `host` spells (an IPv6 zone dropped), or None for a name or nothing."""
    if not host:
        return None
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def is_loopback(host: str | None) -> bool:
    """localhost, 127.0.0.0/8, ::1, and IPv4-mapped loopback addresses."""
    if host == "localhost":
        return True
    address = parse_ip(host)
    if address is None:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
