"""`corral serve`: the daemon on a Unix socket, and optionally on TCP.

SqliteStore(state_dir/jobs.db) + LocalExecutor + this machine (or a simulated one) -> Daemon
a tick thread: daemon.tick() every tick_s, and at once after a submit or cancel
uvicorn on the sockets (one server, one event loop):
    Unix socket (mode 0666)  every connection carries its peer's (uid, gid, user) from SO_PEERCRED; every request's
                             Host must name this machine (corral.api.hosts: DNS rebinding through a forward), or 421
    TCP (--listen, 127.0.0.1 unless a host is named)  every request must carry a token: "Authorization: Bearer <t>",
                             DC/OS's "Authorization: token=<t>", or Basic auth with the token as password; it then
                             acts as the token's user, or gets 401

Files (the state directory is a trust boundary):
    STATE_DIR (0700)  jobs.db, -wal, -shm, tokens.json (0600), logs/ (0700; each log 0600, owned by its job's user)
                      private to the daemon's user: the daemon runs with umask 077 and, on start, takes back the
                      modes an older corral left (0644 databases holding tokens and environments)
    RUNTIME_DIR       the socket's directory (root's default /run/corral, 0755): the only thing others reach; a
                      root daemon's MPS pipe directories live here too, since jobs of other users must reach them
A root daemon's defaults are system locations (/var/lib/corral, /run/corral; see corral.cli.client).

Shutdown: SIGTERM or SIGINT stops the server (requests in flight get SHUTDOWN_GRACE_S), the tick loop and the
store; none of it waits for a tick that holds the lock. If cleaning up has not finished SHUTDOWN_DEADLINE_S after
the signal, the process exits anyway: every acknowledged write is already durable in SQLite's WAL, and jobs outlive
the daemon (a restart adopts them), so there is nothing left whose loss a faster exit would cause. `corral serve`
(exit_process) then ends the process at once, with the atexit reports, rather than have the interpreter join the
worker threads still busy (a service's health check waits up to its timeoutSeconds, 20 s by default; a request's
thread may wait for a stuck lock): that join was what kept a daemon 4-10 s after SIGTERM (issue 23, finding 15).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import fcntl
import gc
import io
import ipaddress
import logging
import os
import pwd
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from corral.api import hosts
from corral.api.app import PEER_KEY, VIA_KEY, create_app
from corral.api.limits import face_of, message_answer
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
from corral.daemon.gang import GangExecutor
from corral.daemon.lockstat import Released, daemon_lock
from corral.daemon.preemption import DEFAULT_GRACE_S
from corral.daemon.queues import Queues
from corral.daemon.queues import default_path as default_queues_path
from corral.daemon.tokens import TokenFileError, TokenStore
from corral.dashboard import Dashboard, cross_site_write, is_open
from corral.dashboard.sessions import Sessions
from corral.executor.container import RUNTIMES
from corral.executor.local import LocalExecutor
from corral.gpu.discovery import GpuDiscoveryError, discover_gpus, local_node
from corral.gpu.metrics import NvmlSampler
from corral.gpu.mps import MpsControl
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.environment import RULE, admitted_environment, is_denied
from corral.model.errors import CorralError, InvalidRequest
from corral.model.resources import GpuBehavior, Node
from corral.placement import PlacementConfig
from corral.placement.native import kernels
from corral.placement.registry import get_policy
from corral.services import health
from corral.services.ports import ENV as PORTS_ENV
from corral.services.ports import parse_range
from corral.store import SqliteStore
from corral.store.retention import DEFAULT_RETENTION_S, Pruner
from corral.tenancy.config import QueueConfigError
from corral.tenancy.reservation import DEFAULT_TIME_LIMIT_S

log = logging.getLogger("corral.serve")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


SHARING_MODES = ("mps", "time-slicing")
#: Seconds requests in flight get to finish after SIGTERM (one waiting for a stuck tick's lock would wait forever).
SHUTDOWN_GRACE_S = 1.0
#: Under a burst of submissions, a round that used c seconds of CPU is followed by this many times c of rest.
REST_PER_ROUND_CPU = 3.0
#: The longest rest after a round (a round of 0.67 s of CPU or more: a very long queue).
MAX_ROUND_REST_S = 2.0
#: Between two steps of a restart's catch-up (Daemon.catch_up), so that requests waiting for the lock get it.
CATCH_UP_PAUSE_S = 0.002
#: Seconds after SIGTERM at which the daemon exits even if cleaning up has not finished.
SHUTDOWN_DEADLINE_S = 1.8  # under 2 s with the exit itself
#: The daemon's own files and folders: nobody else may read or enter them.
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700
#: What corral keeps in the state directory (the database's files, tokens, the logs' folder).
STATE_FILES = ("jobs.db", "jobs.db-wal", "jobs.db-shm", "jobs.db-journal", "tokens.json", "logs", "daemon.lock")
#: Held (flock, exclusive) by the one daemon of a state directory for its whole life; it holds that daemon's pid.
LOCK_FILE = "daemon.lock"
#: Paths any TCP client may ask without a token (probes): they tell nothing but that the daemon is up and ready.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
#: The daemon's own log lines (job starts, ends, refusals, warnings) on stderr, after the "listening" line.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The socket's folder, when it is not the state directory: others must be able to reach the socket in it.
RUNTIME_DIR_MODE = 0o755


class ServeError(CorralError):
    """`corral serve` cannot start; the message says what to do."""


def round_rest(cpu_s: float, held_s: float = 0.0) -> float:
    """Seconds from the end of a round to the start of the next, at the least: 3 times the more of the CPU it used
    (`cpu_s`) and the time it held the daemon's lock (`held_s`, its launches' waits on their supervisors left out:
    they run without the lock).

    A burst of submissions wakes the loop for each one, and a round looks at the whole queue: the next round waits
    3 c after the last, so scheduling takes at most a quarter of the CPU (and of the GIL the submissions need) under
    a burst, however long the queue makes a round, while a quick round is followed at once. And at most a quarter of
    the lock's time, which each submission needs: on a loaded machine a round holds the lock for several times its
    CPU (waiting for a core and for the GIL), and paced by its CPU alone the rounds held the lock most of the time
    and a burst of 5,000 submissions with queues on lost 40 % of its rate (169/s against 193-295/s, issue 26, item 7).
    Launches do not count: they wait on their supervisors without the lock, and counting them slowed an array's
    1,000 starts. (Before either: nothing past 0.2 s from a round's start; a round past 0.2 s, which a queue of
    thousands with queues on reaches on a busy machine, was followed by the next at once.)"""
    return min(MAX_ROUND_REST_S, REST_PER_ROUND_CPU * max(cpu_s, held_s))


def start_frozen() -> int:
    """Put what the start made out of the garbage collector's sight (`gc.freeze`); returns how many objects.

    Modules, classes, FastAPI's routes and pydantic's schemas (hundreds of thousands of objects) live as long as the
    process, and every full collection walked them all: 50-70 ms of CPU, which fell under the daemon's lock when a
    round or a restart's catch-up was the code that allocated the most (issue 26, item 7: a catch-up's hold of
    545 ms at a load of 5; none over 30 ms with them frozen). Objects are still freed by their reference counts; the
    start's few cycles of garbage are kept (a collection first would cost the restart's first answer 50-70 ms)."""
    gc.freeze()
    return gc.get_freeze_count()


class _LetGo:
    """`Released` for a round's launches, counting the seconds the lock was let go."""

    def __init__(self, lock: threading.Lock, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock, self.clock = lock, clock
        self.seconds = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        began = self.clock()
        try:
            with Released(self.lock):
                yield
        finally:
            self.seconds += self.clock() - began


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
        host = hosts.foreign_host(scope.get("headers", ())) if scope["type"] == "http" else None
        if host is not None:  # e.g. a page elsewhere that rebound its name to a port forwarded to this socket
            path = scope.get("path", "/")
            await message_answer(hosts.STATUS, path, "host", hosts.refusal(host))(scope, receive, send)
            return
        # another site's form or fetch through a forwarded port (corral.dashboard.cross_site_write)
        forged = cross_site_write(scope.get("method", "GET"), scope.get("headers", ())) if host is None else None
        if forged is not None and scope["type"] == "http":
            await message_answer(403, scope.get("path", "/"), "origin", forged)(scope, receive, send)
            return
        scope = dict(scope)
        scope[PEER_KEY] = self.peer
        scope[VIA_KEY] = "unix"
        await self.app(scope, receive, send)


def token_secret(header: str) -> str | None:
    """The token an Authorization header carries, in any of the schemes corral's clients send:

    Bearer <secret>           corral's CLI, httpx, curl
    token=<secret>            DC/OS clients (marathon-python's and dcos-metronome's auth_token=)
    Basic base64(user:secret) clients that only know a user and a password (chronos-python); the user is ignored:
                              the token alone says who the caller is
    """
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return rest.strip()
    if scheme.lower().startswith("token="):
        return header.strip()[len("token=") :].strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class _WithToken:
    """ASGI wrapper for TCP connections: the caller is the owner of the request's token, or the answer is 401 (in
    the shape of the face asked: corral's, or the peer's under /marathon, /metronome, /chronos)."""

    def __init__(self, app: AsgiApp, tokens: TokenStore, sessions: Sessions | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope.get("path", "/"), scope.get("method", "GET")
        if scope["type"] != "http" or path in OPEN_PATHS or is_open(method, path):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
        # The dashboard's browser session (corral.dashboard.sessions): reads only, and never instead of a header.
        session = None
        if self.sessions is not None and not header:
            session = self.sessions.peer_of_request(method, path, scope.get("headers", ()))
        if session is not None:
            scope = dict(scope)
            scope[PEER_KEY] = session
            scope[VIA_KEY] = "session"
            await self.app(scope, receive, send)
            return
        secret = token_secret(header)
        token = self.tokens.verify(secret) if secret else None
        if token is None:
            why = "a bearer token is required over TCP" if not header else "the bearer token is not valid"
            path = scope.get("path", "/")
            # chronos-python's username/password (httplib2) answers only a Basic challenge, and cannot parse a bare
            # "Bearer" at all; elsewhere Basic stays unannounced, so that browsers do not prompt for a password.
            challenge = 'Bearer realm="corral", Basic realm="corral"' if face_of(path) == "chronos" else "Bearer"
            answer = message_answer(
                401,
                path,
                "authorization",
                f"{why} (see `corral token create`)",
                headers={"www-authenticate": challenge},
            )
            await answer(scope, receive, send)
            return
        scope = dict(scope)
        scope[PEER_KEY] = (token.uid, token.gid, token.user)
        scope[VIA_KEY] = "token"
        await self.app(scope, receive, send)


def protocol_for(tokens: TokenStore, sessions: Sessions | None = None) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, with each connection's identity: Unix peer credentials, or TCP bearer tokens (or
    the dashboard's session cookie)."""

    class CorralH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                creds = peer_credentials(sock)
                if creds is not None:
                    self.app = _WithPeer(self.app, creds)
            else:
                self.app = _WithToken(self.app, tokens, sessions)

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


# ------------------------------------------------------------------------------------------------ files
#: Links followed on the way to a path before it is refused (the kernel's own limit).
MAX_LINKS = 40


def untrusted_step(path: Path, *, last: bool = False) -> str | None:
    """What on the way to `path` a user other than root and the daemon's could change, None if nothing.

    The daemon checks its folders once and then uses them by path (SQLite opens jobs.db by name; the socket is bound,
    then made 0666, by name; the queues file is read again on every reload). That is safe only if nobody else can
    swap a folder or a link on the way between the check and the use: every folder and link reached from / (links
    followed as the kernel does) must belong to root or the daemon's user, and no folder may be writable by others
    unless sticky (/tmp: others cannot replace what is not theirs). `last`: check the final entry too (a file);
    otherwise only a link there is checked and followed, the folder itself is its caller's to judge. What does not
    exist yet is the daemon's to create."""
    trusted_uids, trusted_gids = {0, os.geteuid()}, {0, os.getegid()}
    parts = list((Path.cwd() / path).parts[1:])  # not abspath(): `..` after a link is the link's target's parent
    current, links = "/", 0
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{candidate} cannot be checked ({exc.strerror or exc})"
        final = not any(p not in ("", ".") for p in parts)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted_uids:
                return f"the link {candidate} belongs to uid {st.st_uid}"
            links += 1
            if links > MAX_LINKS:
                return f"{path} goes through more than {MAX_LINKS} links"
            target = os.readlink(candidate)
            parts = [*Path(target).parts[1 if os.path.isabs(target) else 0 :], *parts]
            current = "/" if os.path.isabs(target) else current
            continue
        if not final or last:
            if st.st_uid not in trusted_uids:
                return f"{candidate} belongs to uid {st.st_uid}"
            mode = stat.S_IMODE(st.st_mode)
            shared = mode & stat.S_IWOTH or (mode & stat.S_IWGRP and st.st_gid not in trusted_gids)
            if shared and not (stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
                return f"{candidate} is writable by other users (mode {mode:o})"
        current = candidate
    return None


def refuse_untrusted(path: Path, what: str, *, last: bool = False) -> None:
    step = untrusted_step(path, last=last)
    if step is not None:
        raise ServeError(
            f"{what} {path} is reached through what another user could swap for their own: {step}; give a path "
            "whose folders and links belong to root or the daemon's user"
        )


def _own_state_dir(state_dir: Path) -> None:
    """Create the state directory (0700) if missing; refuse one that is not a folder of the daemon's user alone."""
    refuse_untrusted(state_dir, "the state directory")
    state_dir.mkdir(parents=True, mode=PRIVATE_DIR, exist_ok=True)
    refuse_untrusted(state_dir, "the state directory")
    st = os.stat(state_dir)  # the directory may be a link the administrator made (/var/lib/corral -> /data/corral)
    if not stat.S_ISDIR(st.st_mode):
        raise ServeError(f"the state directory {state_dir} is not a directory")
    if st.st_uid != os.geteuid():
        raise ServeError(
            f"the state directory {state_dir} belongs to uid {st.st_uid}, not to the daemon's user (uid {os.geteuid()})"
            ": give corral serve a directory of its own (--state-dir)"
        )
    if st.st_mode & (stat.S_IWOTH | stat.S_ISVTX):
        raise ServeError(
            f"the state directory {state_dir} is a shared folder (mode {stat.S_IMODE(st.st_mode):o}): give corral serve"
            " a directory of its own (--state-dir)"
        )


def hold_state_dir(state_dir: Path) -> io.FileIO:
    """STATE_DIR/daemon.lock, open and locked (flock, exclusive) for as long as it stays open, with this
    process's pid written in it. A second daemon on the same state directory (whatever its socket) would run the same
    jobs from the same database twice: it is refused, before it creates or changes anything, with the first's pid.

    The descriptor is close-on-exec, so no process the daemon starts (the zygote, whose supervisors outlive the
    daemon; MPS; container runtimes) keeps the lock after the daemon ends, and a restart is never refused by a job."""
    _own_state_dir(state_dir)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        pid = f"pid {holder}" if holder.isdigit() else "its pid not yet written"
        raise ServeError(
            f"another corral serve ({pid}) is running on the state directory {state_dir} (it holds {path}): stop it "
            "first, or give this one another --state-dir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return io.FileIO(fd, "r+")  # closed (the lock released) by close(), or when a failed start drops it


def make_private(state_dir: Path) -> None:
    """Create the state directory (0700) or take back an existing one: the directory becomes the daemon user's alone
    (0700), and so do the files an older corral kept in it (0600: jobs.db and its WAL, SHM and journal, tokens.json,
    the logs; logs/ 0700; each log keeps its owner, the job's user).

    An older corral left jobs.db and its WAL 0644 in a 0755 directory, with tokens and environments inside; this runs
    on every start, so an upgrade closes that at once. Only corral's own entries change mode (a mistaken --state-dir
    must not lose its files' modes), and a folder others may write to (/tmp) is refused rather than closed."""
    _own_state_dir(state_dir)
    os.chmod(state_dir, PRIVATE_DIR)
    logs = state_dir / "logs"
    entries = [state_dir / name for name in STATE_FILES]
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        entries += [logs / name for name in os.listdir(logs)]
    for path in entries:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            want = PRIVATE_DIR
        elif stat.S_ISREG(mode):
            want = PRIVATE_FILE
        else:
            continue  # a link is neither followed nor changed
        if stat.S_IMODE(mode) != want:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(path, want)


def prepare_runtime_dir(runtime_dir: Path, state_dir: Path) -> None:
    """The socket's folder: one corral creates is 0755, so other users reach the socket (0666) in it; one that exists
    (a folder the administrator made) keeps its mode. Inside the state directory it stays private.

    Clients send their environment through this socket, so nobody but root and the daemon's user may be able to put
    another socket in its place: the folder must be theirs, and not writable by others unless sticky (/tmp)."""
    if runtime_dir.resolve() == state_dir.resolve():
        return
    refuse_untrusted(runtime_dir, "the socket's folder")
    if not runtime_dir.is_dir():
        runtime_dir.mkdir(parents=True, mode=RUNTIME_DIR_MODE, exist_ok=True)
        os.chmod(runtime_dir, RUNTIME_DIR_MODE)  # mkdir's mode is cut by the umask (077)
    st = runtime_dir.stat()
    if st.st_uid not in (0, os.geteuid()):
        raise ServeError(
            f"the socket's folder {runtime_dir} belongs to uid {st.st_uid}: another user could replace "
            "the socket; use a folder of root's or the daemon's user (--runtime-dir, --socket)"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ServeError(
            f"the socket's folder {runtime_dir} is writable by other users, who could replace the "
            f"socket (mode {stat.S_IMODE(st.st_mode):o}); use one only its owner can write to"
        )


def drop_client_credentials() -> None:
    """Remove corral's client variables (CORRAL_TOKEN above all) and login agents from the daemon's own environment,
    so that nothing it starts (MPS daemons, container runtimes, health checks) inherits them. The daemon's settings
    that are read later (CORRAL_SERVICE_PORTS) stay."""
    for name in [n for n in os.environ if is_denied(n) and n != PORTS_ENV]:
        del os.environ[name]


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
    watchdog: str = "kill",
    sharing: str = "mps",
    listen: str | None = None,
    gpu_behavior: str = "preferential",
    service_ports: str | None = None,
    container_runtime: str | None = None,
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    reports: Path | None = None,
    preempt_grace_s: float = DEFAULT_GRACE_S,
    queues_file: Path | None = None,
    exit_process: bool = False,
    retention_s: float | None = DEFAULT_RETENTION_S,
) -> None:
    """Run the daemon until SIGTERM or SIGINT.

    `sharing`: "mps" enforces a share of one GPU with MPS where the machine has it (one Unix user per GPU at a time);
    "time-slicing" lets shares of different users share a GPU without MPS (the memory watchdog guards the grants).
    `watchdog`: what happens to a job over its GPU memory grant where MPS does not enforce it: off, warn or kill.
    `listen`: also serve over TCP at [HOST:]PORT (127.0.0.1 unless a host is named), with bearer tokens.
    `container_runtime`: "docker" or "podman" runs job definitions that name an image; None refuses them.
    `default_time_limit_s`: how long a job without a time limit is expected to run, when the head of the queue's
    reservation is planned (docs/backfill.md); not enforced.
    `reports`: a folder of `corral sim` reports the dashboard shows (docs/dashboard.md).
    `preempt_grace_s`: between the SIGTERM and the SIGKILL of a preempted job (docs/preemption.md).
    `queues_file`: queues, limits and fair share (docs/queues.md); None: STATE_DIR/queues.toml if it exists, else one
    queue without limits. SIGHUP (or POST /v1/queues/reload) reads it again; a bad file leaves the old in place.
    `retention_s`: how long jobs that ended are kept (job and accounting record), None for ever (docs/acct.md).
    `exit_process`: once stopped and cleaned up, end the process (status 0) instead of returning (see the module's
    note on shutdown); `corral serve` sets it.
    """
    if reports is not None and not reports.is_dir():
        raise ServeError(f"--reports: {reports} is not a folder (give the folder `corral sim ... --out` wrote)")
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
    try:
        config = PlacementConfig(policy=policy, gpu_behavior=behavior)
        compiled = getattr(get_policy(policy), "compiled", False)
    except InvalidRequest as exc:
        raise ServeError(f"--policy: {exc.message}") from None
    if compiled:
        # fgd and its descendants score through compiled kernels: loaded (compiled, on a fresh install) now, under
        # the default umask, and not in the first decision (`placement.native`).
        kernels()
    if queues_file is None and default_queues_path(state_dir).is_file():
        queues_file = default_queues_path(state_dir)
    if queues_file is not None:  # it says who may submit, and at what priority: nobody else may write it
        refuse_untrusted(queues_file, "--queues: the queues file", last=True)
    try:
        queues = Queues.open(queues_file, node)
    except QueueConfigError as exc:
        raise ServeError(f"--queues: {exc}") from None
    if queues_file is None:  # none yet: a reload reads the default location once an administrator writes it
        queues.path = default_queues_path(state_dir)
    # One daemon per state directory, for its whole life: a second is refused before it creates or changes anything.
    state_lock = hold_state_dir(state_dir)
    # Everything the daemon creates from here on (SQLite's files, tokens, logs, folders) is its user's alone.
    os.umask(0o077)
    drop_client_credentials()
    make_private(state_dir)
    runtime_dir = socket_path.parent
    prepare_runtime_dir(runtime_dir, state_dir)
    _check_free(socket_path)
    store = SqliteStore(state_dir / "jobs.db")
    # An older corral stored each submitter's whole environment, CORRAL_TOKEN included: clean those jobs now.
    scrubbed = store.scrub_submitted_env(admitted_environment, RULE)
    if scrubbed:
        log.warning("removed corral credentials and login agents from the stored environment of %d jobs", scrubbed)
    try:
        tokens = TokenStore(state_dir / "tokens.json")
    except TokenFileError as exc:
        raise ServeError(str(exc)) from None
    executor = GangExecutor(  # a gang's instances run as processes of their own (corral.daemon.gang)
        LocalExecutor(run_dir=state_dir / "run"),  # supervisors record outcomes there (see corral.executor)
        instances_of=lambda job_id: job.spec.instances if (job := store.get(job_id)) is not None else 1,
    )
    # Shares are enforced with MPS where the machine has it (never for a simulated inventory). Jobs of every user must
    # reach the pipe directories, so they live beside the socket, not in the private state directory.
    shared_dir = runtime_dir if runtime_dir.resolve() != state_dir.resolve() else state_dir
    mps = MpsControl(shared_dir / "mps") if simulate is None and sharing == "mps" else None
    if mps is not None and not mps.available():
        mps = None
    sampler = NvmlSampler() if simulate is None else None
    daemon = Daemon(
        store, executor, node, config, state_dir, mps=mps, sampler=sampler, watchdog=watchdog,
        container_runtime=container_runtime, default_time_limit_s=default_time_limit_s,
        preempt_grace_s=preempt_grace_s, queues=queues,
    )  # fmt: skip
    lock = daemon_lock()  # a threading.Lock that times its holds; the figures go to stderr at exit
    woken = threading.Event()
    stop = threading.Event()
    held = _hold_logs()
    # Controllers first: a job the restart finds lost is reported to the controller that made it.
    routers = install_extensions(daemon, lock, woken.set)
    dashboard = Dashboard(daemon, tokens, reports)
    routers = [*routers, dashboard.router()]
    with lock:
        # The jobs that hold resources now, before anyone is answered; what grows with the history (requeues decided
        # and not stored, fair share's usage) is caught up in the loop, a page per hold of the lock, before its first
        # round (Daemon.catch_up): a daemon with a long history answers at once after a restart (issue 26, item 7).
        daemon.recover_live()
    gpus = ", ".join(f"{g.index}: {g.model} {g.memory_mib} MiB" for g in node.gpus) or "none"
    label = f"SIMULATED GPU inventory {simulate} (no real devices)" if simulate else f"GPUs {gpus}"
    if simulate is None:
        if mps is not None:
            label += "; one-GPU shares enforced with MPS"
        else:
            label += "; time-sliced shares (no MPS)" if sharing == "time-slicing" else "; no MPS here"
        label += f"; GPU memory watchdog: {watchdog}"

    daemon.quiet_rounds = True  # a pass whose inputs did not change is left out (core.QUIET_ROUND_S)

    def loop() -> None:
        steps = daemon.catch_up()
        while not stop.is_set():
            try:
                with lock:
                    next(steps)
            except StopIteration:
                break
            except Exception:  # e.g. the store fails: the start's work is tried again from the start
                log.exception("catching up after the start failed")
                steps = daemon.catch_up()
                stop.wait(tick_s)
            # A moment between steps: a request waiting for the lock gets it (a lock is not fair; this thread would
            # otherwise take it back at once, step after step).
            stop.wait(CATCH_UP_PAUSE_S)
        while not stop.is_set():
            cpu = time.thread_time()
            let_go = _LetGo(lock)
            held = 0.0
            try:
                with lock:
                    began = time.monotonic()
                    try:
                        daemon.tick(unlocked=let_go)  # launches run without the lock
                    finally:
                        held = time.monotonic() - began - let_go.seconds
            except Exception:  # keep scheduling; the next tick tries again
                log.exception("tick failed")
            cpu = time.thread_time() - cpu
            ended = time.monotonic()
            woken.wait(tick_s)
            woken.clear()
            rest = round_rest(cpu, held) - (time.monotonic() - ended)
            if rest > 0:
                stop.wait(rest)

    ticker = threading.Thread(target=loop, name="corral-tick", daemon=True)
    app = create_app(daemon, lock, woken.set, tokens, routers=routers)
    finished = threading.Event()

    def stopping() -> None:
        """At the first SIGTERM/SIGINT: stop the tick loop, and make sure the process ends within the deadline."""
        if stop.is_set():
            return
        stop.set()
        woken.set()

        def deadline() -> None:
            if finished.wait(SHUTDOWN_DEADLINE_S):
                return
            # A tick (or a request) holds the lock and does not return: exit without it (see the module's note).
            log.error("corral serve: shutdown did not finish in %.1f s; exiting now", SHUTDOWN_DEADLINE_S)
            with contextlib.suppress(OSError):
                socket_path.unlink()
            health.stop_commands()
            os._exit(0)

        threading.Thread(target=deadline, name="corral-shutdown-deadline", daemon=True).start()

    server = _Server(
        uvicorn.Config(
            app,
            log_level="warning",
            http=protocol_for(tokens, dashboard.sessions),
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
        ),
        stopping,
    )

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        server.should_exit = True
        stopping()

    def reload_queues() -> None:
        with lock:
            try:
                queues.reload(store, daemon.clock())
            except QueueConfigError as exc:
                log.error("queues not reloaded (the old configuration stays): %s", exc)
        woken.set()

    def on_hangup(sig: int, _frame: FrameType | None) -> None:
        # Not in the handler itself: the reload takes the daemon's lock, which a round may hold.
        threading.Thread(target=reload_queues, name="corral-reload-queues", daemon=True).start()

    # Before the socket exists: a SIGTERM that comes as soon as a client can connect must stop the daemon cleanly.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    sockets = [bind_unix(socket_path)]
    where = str(socket_path)
    if tcp_at is not None:
        try:
            sockets.append(bind_tcp(*tcp_at))
        except ServeError:
            _log_to_stderr(held)  # what the start did so far (e.g. a restart's outcomes) is not lost
            sockets[0].close()
            socket_path.unlink(missing_ok=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            raise
        bound = sockets[1].getsockname()[1]  # the port the system chose for --listen HOST:0
        host = f"[{tcp_at[0]}]" if ":" in tcp_at[0] else tcp_at[0]
        where += f" and http://{host}:{bound} (bearer tokens)"
        if not is_loopback(tcp_at[0]):
            label += "; WARNING: TCP is not loopback-only and carries tokens in clear text: put TLS in front of it"
    label += f"; work without GPUs: {behavior.value}"
    if daemon.containment:  # jobs in cgroup leaves, or "no cgroups: falling back to process groups (why)"
        label += f"; {daemon.containment}"
    sys.stderr.write(f"corral serve: listening on {where}; state in {state_dir}; policy {policy}; {label}\n")
    sys.stderr.flush()
    _log_to_stderr(held)

    start_frozen()
    ticker.start()
    dashboard.start()
    pruner = Pruner(store, retention_s) if retention_s is not None else None
    if pruner is not None:
        pruner.start()
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        stopping()
        if pruner is not None:
            pruner.stop()
        # Bounded: a tick stuck holding the lock must not keep the daemon alive (the tick thread is a daemon thread).
        ticker.join(timeout=SHUTDOWN_GRACE_S)
        dashboard.close()
        health.stop_commands()  # their threads are not waited for (_exit_now): nothing else would end them
        executor.close()
        if sampler is not None:
            sampler.close()
        if lock.acquire(timeout=SHUTDOWN_GRACE_S):
            try:
                store.close()
            finally:
                lock.release()
        else:  # SQLite's WAL already holds every commit; the file is closed when the process ends
            log.warning("corral serve: a tick still holds the lock; leaving the store to close with the process")
        with contextlib.suppress(OSError):
            socket_path.unlink()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        state_lock.close()  # the last thing: nothing of this daemon touches the state directory after it
        gc.unfreeze()  # serve() run in a longer process (tests): what it froze may be collected again
        finished.set()
    if exit_process:
        _exit_now()


def _exit_now() -> None:
    """End the process now, as a normal exit would but without joining the threads left (module's note): atexit
    handlers (the lock's figures), logging and the standard streams flushed, then _exit(0)."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


class _HeldLogs(logging.Handler):
    """corral's log records, kept until the "listening" line is out (clients and scripts wait for that line first).

    flush and close do nothing: uvicorn's logging set-up (dictConfig) closes every handler, and must not end the hold.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _hold_logs() -> _HeldLogs | None:
    """corral's loggers at info level (the root logger is left to whoever embeds corral), held from now on, e.g. the
    outcomes a restart finds. None if corral's logger has a handler already."""
    logger = logging.getLogger("corral")
    if logger.handlers:
        return None
    held = _HeldLogs()
    logger.addHandler(held)
    logger.setLevel(logging.INFO)
    return held


def _log_to_stderr(held: _HeldLogs | None) -> None:
    """What was held, then every line as it comes, on stderr."""
    if held is None:
        return
    logger = logging.getLogger("corral")
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.removeHandler(held)  # nothing else logs meanwhile: the tick thread and the server have not started
    for record in held.records:
        stream.handle(record)
    logger.addHandler(stream)


class _Server(uvicorn.Server):
    """uvicorn's server, telling the daemon at once when a signal asks it to stop (uvicorn's own handler is the one
    installed while it runs)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._on_exit()
