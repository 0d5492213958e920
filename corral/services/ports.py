"""Host ports for service instances: `$PORT0`, `$PORT1`, ... from a range of this machine's ports.

A port is handed out when no live instance holds it and nothing on the machine is bound to it now (a bind test).
The search starts after the last port handed out, so a port an instance just gave up is not reused at once (a
client may still talk to the old instance). `requirePorts` apps get the ports their definition names, or wait.
Mesos agents offer 31000-32000 by default; `corral serve` reads `CORRAL_SERVICE_PORTS` ("LOW-HIGH") to change it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from corral.model.errors import InvalidRequest

DEFAULT_RANGE = (31000, 32000)
ENV = "CORRAL_SERVICE_PORTS"


def parse_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        lo, hi = -1, -1
    if not (1 <= lo <= hi <= 65535):
        raise InvalidRequest(ENV, f"give LOW-HIGH with 1 <= LOW <= HIGH <= 65535, got {text!r}")
    return lo, hi


def range_from_env() -> tuple[int, int]:
    text = os.environ.get(ENV, "").strip()
    return parse_range(text) if text else DEFAULT_RANGE


def bindable(port: int) -> bool:
    """True when nothing on this machine listens on (or holds) the TCP port."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            sock.bind((host, port))
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                sock.close()
    return True


class NoPorts(Exception):
    pass


@dataclass
class PortAllocator:
    low: int = DEFAULT_RANGE[0]
    high: int = DEFAULT_RANGE[1]
    free: Callable[[int], bool] = bindable
    _next: int = 0

    def allocate(self, count: int, taken: Collection[int], fixed: Sequence[int] = ()) -> list[int]:
        """`count` ports none of `taken`; `fixed` (requirePorts): exactly these. Raises NoPorts saying why not."""
        if fixed:
            busy = [p for p in fixed if p in taken or not self.free(p)]
            if busy:
                raise NoPorts(f"port {', '.join(map(str, busy))} (requirePorts) is in use")
            return list(fixed)
        size = self.high - self.low + 1
        start = self._next if self.low <= self._next <= self.high else self.low
        got: list[int] = []
        for step in range(size):
            if len(got) == count:
                break
            port = self.low + (start - self.low + step) % size
            if port not in taken and self.free(port):
                got.append(port)
        if len(got) < count:
            raise NoPorts(f"no {count} free ports in {self.low}-{self.high} (set {ENV} to widen the range)")
        if got:
            self._next = got[-1] + 1
        return got
