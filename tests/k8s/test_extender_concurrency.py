"""Throughput behind a real kube-scheduler depends on two things the fakes did not show: binds that arrive together
are served together (kube-scheduler binds asynchronously, many pods at once), and no answer waits for the client's
delayed ACK (Nagle's algorithm holds the body, written after the headers, for 40 ms)."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from corral.k8s.cli import bind_socket
from corral.k8s.extender import create_app
from tests.k8s.conftest import Cluster, Served, free_port, gpu_node
from tests.k8s.test_extender import bind_args, kube_pod


def test_accepted_connections_send_without_nagles_delay() -> None:
    listener = bind_socket("127.0.0.1", free_port())
    got: list[int] = []

    async def serve() -> None:
        async def handle(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            got.append(w.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            w.close()

        server = await asyncio.start_server(handle, sock=listener)
        with socket.create_connection(listener.getsockname()):
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
        server.close()

    asyncio.run(serve())
    assert got == [1]


def test_binds_that_arrive_together_are_served_together() -> None:
    c = Cluster()
    c.api.put_node(gpu_node("g8", 8))
    c.sync()
    together = threading.Barrier(4, timeout=10)  # each Binding waits until four are in flight at once
    real_bind = c.api.create_binding

    def slow_bind(*args: object, **kwargs: object) -> None:
        together.wait()
        real_bind(*args, **kwargs)  # type: ignore[arg-type]

    c.api.create_binding = slow_bind  # type: ignore[method-assign]
    pods = [kube_pod(f"p{i}", {"corral.dev/gpu": "1"}) for i in range(4)]
    for p in pods:
        c.api.put_pod(p)
    with Served(create_app(c.extender)) as url, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: httpx.post(f"{url}/bind", json=bind_args(p, "g8"), timeout=30).json(), pods))
    assert answers == [{"Error": ""}] * 4  # served one at a time, the first would have waited for the barrier alone
    c.sync()
    assert c.state.snapshot is not None and c.state.snapshot.gpu_allocated_milli == 4000
