"""`corral serve`: the daemon on a Unix socket, and optionally on TCP.

SqliteStore(state_dir/jobs.db) + LocalExecutor + this machine (or a simulated one) -> Daemon
a tick thread: daemon.tick() every tick_s, and at once after a submit or cancel
uvicorn on the sockets (one server, one event loop):
    Unix socket (mode 0666)  every connection carries its peer's (uid, gid, user) from SO_PEERCRED
    TCP (--listen, 127.0.0.1 unless a host is named)  every request must carry "Authorization: Bearer <token>";
                             it then acts as the token's user, or gets 401
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
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

from corral.api.app import PEER_KEY, VIA_KEY, create_app
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
from corral.daemon.lockstat import daemon_lock
from corral.daemon.tokens import TokenFileError, TokenStore
from corral.executor.container import RUNTIMES
from corral.executor.local import LocalExecutor
from corral.gpu.discovery import GpuDiscoveryError, discover_gpus, local_node
from corral.gpu.metrics import NvmlSampler
from corral.gpu.mps import MpsControl
from corral.gpu.simulated import parse_simulated_inventory
from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import GpuBehavior, Node
from corral.placement import PlacementConfig
from corral.services.ports import ENV as PORTS_ENV
from corral.services.ports import parse_range
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
    """ASGI wrapper: every scope of one Unix-socket connection carries that connection's peer."""

    def __init__(self, app: AsgiApp, peer: tuple[int, int, str]) -> None:
        self.app = app
        self.peer = peer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope = dict(scope)
        scope[PEER_KEY] = self.peer
        scope[VIA_KEY] = "unix"
        await self.app(scope, receive, send)


class _WithToken:
    """ASGI wrapper for TCP connections: the caller is the owner of the request's bearer token, or the answer is 401."""

    def __init__(self, app: AsgiApp, tokens: TokenStore) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
        scheme, _, secret = header.partition(" ")
        token = self.tokens.verify(secret.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            why = "a bearer token is required over TCP" if not header else "the bearer token is not valid"
            body = json.dumps({"detail": {"field": "authorization", "message": f"{why} (see `corral token create`)"}})
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": body.encode()})
            return
        scope = dict(scope)
        scope[PEER_KEY] = (token.uid, token.gid, token.user)
        scope[VIA_KEY] = "token"
        await self.app(scope, receive, send)


def protocol_for(tokens: TokenStore) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, with each connection's identity: Unix peer credentials, or TCP bearer tokens."""

    class CorralH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                creds = peer_credentials(sock)
                if creds is not None:
                    self.app = _WithPeer(self.app, creds)
            else:
                self.app = _WithToken(self.app, tokens)

    return CorralH11Protocol


def parse_listen(value: str) -> tuple[str, int]:
    """`--listen` as (host, port): "8470" -> ("127.0.0.1", 8470); "0.0.0.0:8470"; "[::1]:8470"."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host, port_text = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port < 65536:
        raise ServeError(f"--listen: give [HOST:]PORT with a port in 0..65535 (0: any free port), got {value!r}")
    return host, port


def parse_gpu_behavior(value: str) -> GpuBehavior:
    """The global GPU scheduling behaviour for work without GPUs; an invalid one stops the start (as Marathon's)."""
    try:
        return GpuBehavior(value.strip().lower())
    except ValueError:
        valid = ", ".join(b.value for b in GpuBehavior)
        raise ServeError(f"Setting {value} is invalid. Valid settings are {valid}") from None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    # Anyone may connect: the daemon knows who they are from SO_PEERCRED and lets them see only their own jobs.
    os.chmod(path, 0o666)
    sock.listen(128)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


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
    listen: str | None = None,
    gpu_behavior: str = "preferential",
    service_ports: str | None = None,
    container_runtime: str | None = None,
) -> None:
    """Run the daemon until SIGTERM or SIGINT.

    `sharing`: "mps" enforces a share of one GPU with MPS where the machine has it (one Unix user per GPU at a time);
    "time-slicing" lets shares of different users share a GPU without MPS (the memory watchdog guards the grants).
    `watchdog`: what happens to a job over its GPU memory grant where MPS does not enforce it: off, warn or kill.
    `listen`: also serve over TCP at [HOST:]PORT (127.0.0.1 unless a host is named), with bearer tokens.
    `container_runtime`: "docker" or "podman" runs job definitions that name an image; None refuses them.
    """
    if container_runtime is not None and container_runtime not in RUNTIMES:
        raise ServeError(f"--container-runtime must be one of {', '.join(RUNTIMES)}, got {container_runtime!r}")
    if sharing not in SHARING_MODES:
        raise ServeError(f"--sharing must be one of {', '.join(SHARING_MODES)}, got {sharing!r}")
    tcp_at = parse_listen(listen) if listen is not None else None
    behavior = parse_gpu_behavior(gpu_behavior)
    if service_ports is not None:  # the services controller reads its port range from the environment
        try:
            low, high = parse_range(service_ports)
            os.environ[PORTS_ENV] = f"{low}-{high}"
        except InvalidRequest as exc:
            raise ServeError(f"--service-ports: {exc.message}") from None
    node = build_node(simulate)
    config = PlacementConfig(policy=policy, gpu_behavior=behavior)
    state_dir.mkdir(parents=True, exist_ok=True)
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    _check_free(socket_path)
    store = SqliteStore(state_dir / "jobs.db")
    try:
        tokens = TokenStore(state_dir / "tokens.json")
    except TokenFileError as exc:
        raise ServeError(str(exc)) from None
    executor = LocalExecutor()
    # Shares are enforced with MPS where the machine has it (never for a simulated inventory).
    mps = MpsControl(state_dir / "mps") if simulate is None and sharing == "mps" else None
    if mps is not None and not mps.available():
        mps = None
    sampler = NvmlSampler() if simulate is None else None
    daemon = Daemon(
        store, executor, node, config, state_dir, mps=mps, sampler=sampler, watchdog=watchdog,
        container_runtime=container_runtime,
    )  # fmt: skip
    lock = daemon_lock()  # a threading.Lock that times its holds; the figures go to stderr at exit
    woken = threading.Event()
    stop = threading.Event()
    # Controllers first: a job the restart finds lost is reported to the controller that made it.
    routers = install_extensions(daemon, lock, woken.set)
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
    sockets = [bind_unix(socket_path)]
    where = str(socket_path)
    if tcp_at is not None:
        try:
            sockets.append(bind_tcp(*tcp_at))
        except ServeError:
            sockets[0].close()
            socket_path.unlink(missing_ok=True)
            raise
        bound = sockets[1].getsockname()[1]  # the port the system chose for --listen HOST:0
        host = f"[{tcp_at[0]}]" if ":" in tcp_at[0] else tcp_at[0]
        where += f" and http://{host}:{bound} (bearer tokens)"
        if not is_loopback(tcp_at[0]):
            label += "; WARNING: TCP is not loopback-only and carries tokens in clear text: put TLS in front of it"
    label += f"; work without GPUs: {behavior.value}"
    sys.stderr.write(f"corral serve: listening on {where}; state in {state_dir}; policy {policy}; {label}\n")
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
    app = create_app(daemon, lock, woken.set, tokens, routers=routers)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=protocol_for(tokens)))

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    ticker.start()
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
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
