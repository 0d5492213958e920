"""`corral serve`: the daemon on a Unix socket.

SqliteStore(state_dir/jobs.db) + LocalExecutor + this machine (or a simulated one) -> Daemon
a tick thread: daemon.tick() every tick_s, and at once after a submit or cancel
uvicorn on the socket; every connection carries its peer's (uid, gid, user) from SO_PEERCRED
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pwd
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from corral.api.app import PEER_KEY, create_app
from corral.daemon.core import Daemon
from corral.executor.local import LocalExecutor
from corral.gpu.discovery import GpuDiscoveryError, discover_gpus, local_node
from corral.gpu.metrics import NvmlSampler
from corral.gpu.mps import MpsControl
from corral.gpu.simulated import parse_simulated_inventory
from corral.model.errors import CorralError
from corral.model.resources import Node
from corral.placement import PlacementConfig
from corral.store import SqliteStore

log = logging.getLogger("corral.serve")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


SHARING_MODES = ("mps", "time-slicing")


class ServeError(CorralError):
    """`corral serve` cannot start; the message says what to do."""


# ------------------------------------------------------------------------------------------------ peer credentials
def peer_credentials(sock: socket.socket | None) -> tuple[int, int, str] | None:
    """(uid, gid, user name) of the process on the other end of a Unix socket, None if unknown."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, gid = struct.unpack("3i", raw)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return uid, gid, user


class _WithPeer:
    """ASGI wrapper: every scope of one connection carries that connection's peer."""

    def __init__(self, app: AsgiApp, peer: tuple[int, int, str]) -> None:
        self.app = app
        self.peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope = dict(scope)
        scope[PEER_KEY] = self.peer
        await self.app(scope, receive, send)


class PeerH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        creds = peer_credentials(transport.get_extra_info("socket"))
        if creds is not None:
            self.app = _WithPeer(self.app, creds)


# ------------------------------------------------------------------------------------------------ the daemon
def build_node(simulate: str | None) -> Node:
    if simulate:
        return parse_simulated_inventory(simulate)[0]
    try:
        return local_node(socket.gethostname(), discover_gpus())
    except GpuDiscoveryError as exc:
        raise ServeError(f"{exc}; use --simulate-gpus (e.g. 2xA100-80GB) to run corral without GPUs") from exc


def _check_free(socket_path: Path) -> None:
    if not socket_path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(socket_path))
    except OSError:
        socket_path.unlink(missing_ok=True)  # a stale socket of a daemon that died
        return
    finally:
        probe.close()
    raise ServeError(f"corral serve is already running at {socket_path}")


def serve(
    state_dir: Path,
    socket_path: Path,
    simulate: str | None,
    policy: str,
    tick_s: float = 0.2,
    min_gap_s: float = 0.05,
    watchdog: str = "kill",
    sharing: str = "mps",
) -> None:
    """Run the daemon until SIGTERM or SIGINT.

    `sharing`: "mps" enforces a share of one GPU with MPS where the machine has it (one Unix user per GPU at a time);
    "time-slicing" lets shares of different users share a GPU without MPS (the memory watchdog guards the grants).
    `watchdog`: what happens to a job over its GPU memory grant where MPS does not enforce it: off, warn or kill.
    """
    if sharing not in SHARING_MODES:
        raise ServeError(f"--sharing must be one of {', '.join(SHARING_MODES)}, got {sharing!r}")
    node = build_node(simulate)
    config = PlacementConfig(policy=policy)
    state_dir.mkdir(parents=True, exist_ok=True)
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    _check_free(socket_path)
    store = SqliteStore(state_dir / "jobs.db")
    executor = LocalExecutor()
    # Shares are enforced with MPS where the machine has it (never for a simulated inventory).
    mps = MpsControl(state_dir / "mps") if simulate is None and sharing == "mps" else None
    if mps is not None and not mps.available():
        mps = None
    sampler = NvmlSampler() if simulate is None else None
    daemon = Daemon(store, executor, node, config, state_dir, mps=mps, sampler=sampler, watchdog=watchdog)
    lock = threading.Lock()
    woken = threading.Event()
    stop = threading.Event()
    with lock:
        daemon.recover()
    gpus = ", ".join(f"{g.index}: {g.model} {g.memory_mib} MiB" for g in node.gpus) or "none"
    label = f"SIMULATED GPU inventory {simulate} (no real devices)" if simulate else f"GPUs {gpus}"
    if simulate is None:
        if mps is not None:
            label += "; one-GPU shares enforced with MPS"
        else:
            label += "; time-sliced shares (no MPS)" if sharing == "time-slicing" else "; no MPS here"
        label += f"; GPU memory watchdog: {watchdog}"
    sys.stderr.write(f"corral serve: listening on {socket_path}; state in {state_dir}; policy {policy}; {label}\n")
    sys.stderr.flush()

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                with lock:
                    daemon.tick()
            except Exception:  # keep scheduling; the next tick tries again
                log.exception("tick failed")
            took = time.monotonic() - started
            woken.wait(tick_s)
            woken.clear()
            # A burst of submissions wakes the loop for each one, and a round looks at the whole queue: after a round
            # that took t, the next waits until 4 t have passed since it began (at most `min_gap_s`), so scheduling
            # takes at most about a quarter of the time under a burst while a quick round is followed at once.
            rest = min(min_gap_s, 4 * took) - (time.monotonic() - started)
            if rest > 0:
                stop.wait(rest)

    ticker = threading.Thread(target=loop, name="corral-tick", daemon=True)
    live = None if simulate is not None else (lambda: {g.uuid: g for g in discover_gpus()})
    app = create_app(daemon, lock, woken.set, live)
    server = uvicorn.Server(uvicorn.Config(app, uds=str(socket_path), log_level="warning", http=PeerH11Protocol))

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    ticker.start()
    try:
        server.run()
    finally:
        stop.set()
        woken.set()
        ticker.join(timeout=10)
        executor.close()
        if sampler is not None:
            sampler.close()
        with lock:
            store.close()
        with contextlib.suppress(OSError):
            socket_path.unlink()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
