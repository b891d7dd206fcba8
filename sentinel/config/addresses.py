"""``ADDR:PORT`` as ``--http`` (``http``) takes it: parsed when the settings are loaded, so a
bad address is a config error naming the key, not a failure to listen later."""

from __future__ import annotations

import ipaddress
import re

#: Where ``--http :PORT`` (or a bare port) binds: loopback, unless an address is given.
DEFAULT_HOST = "127.0.0.1"

#: A host name as RFC 1123 writes it: dot-separated labels of letters, digits and hyphens.
_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


class CannotListen(OSError):
    """The address parses but cannot be listened at (the port is taken, the address is not
    this host's, the name does not resolve): ``strerror`` says so in one line."""


def parse_http_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` as ``--http`` takes it: ``127.0.0.1:9464``, ``[::1]:9464``,
    ``0.0.0.0:9464``; ``:9464`` or ``9464`` bind loopback; port 0 picks a free one.

    Raises ValueError naming what is wrong.
    """
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [::1]:9464")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"{text!r}: expected ADDR:PORT, e.g. 127.0.0.1:9464")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: the port must be 0 to 65535")
    if host and not _is_host(host, ipv6=bracketed):
        raise ValueError(f"{text!r}: {host!r} is not an IP address or a host name")
    return host or DEFAULT_HOST, port


def _is_host(host: str, *, ipv6: bool) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return not ipv6 and _HOST_NAME.fullmatch(host) is not None
    return address.version == (6 if ipv6 else 4)
