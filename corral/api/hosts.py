"""Which `Host` a request over the Unix socket may carry (issue 23, finding 8: DNS rebinding).

Over the socket the caller needs no token: the daemon knows who they are from SO_PEERCRED. `ssh -L 8470:SOCKET`
makes a local port act as the ssh user, so a page on another site that rebinds its own name to 127.0.0.1 could read
that port as its own origin, and a browser sends Sec-Fetch-* and Origin only for some requests (not for a simple
navigation or an old browser). Such a request still names the other site in Host, whatever else it carries; so every
request on the socket must name this machine, or a name no DNS answer can give:

    (no Host)                      HTTP/1.0 clients
    corral                         corral's CLI and its clients (http://corral/ over the socket)
    localhost, NAME.localhost      browsers resolve these to loopback themselves, never through DNS (RFC 6761)
    127.0.0.1 (any 127.x), [::1]   a loopback address, not a name
    %2F...                         the socket's path in the URL (requests-unixsocket's http+unix://%2Frun%2F...)

each with any port. Anything else is refused with 421 (Misdirected Request) naming the rule, before any route runs.
TCP is not concerned: every request there carries a token, which a rebinding page does not have.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

#: The names (besides loopback addresses and *.localhost) a request over the socket may give in Host.
SOCKET_HOSTS = frozenset({"corral", "localhost"})
#: What a refusal says (after "Host ... is not this machine: ").
HOST_RULE = (
    "over the Unix socket, Host must be corral, localhost, 127.0.0.1 or [::1] (any port), or be left out; "
    "a browser reaches a forwarded socket as http://localhost:PORT or http://127.0.0.1:PORT"
)
STATUS = 421


def _local(host: str) -> bool:
    if host.lower().startswith("%2f"):  # a percent-encoded path: not a name any DNS answer can give
        return "/" not in host and ":" not in host
    try:
        parts = urlsplit(f"//{host}")
        name = parts.hostname or ""
        _ = parts.port  # ValueError for a port that is not a number
    except ValueError:
        return False
    if name in SOCKET_HOSTS or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def foreign_host(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The Host of a request over the socket that does not name this machine (the module's rule), else None."""
    hosts = [v for k, v in headers if k.lower() == b"host"]
    if not hosts:
        return None
    host = hosts[0].decode("latin-1")
    if len(hosts) > 1:  # h11 refuses this already; never let a second Host decide
        return host
    return None if host == "" or _local(host) else host


def refusal(host: str) -> str:
    return f"Host {host[:80]!r} is not this machine: {HOST_RULE}"
