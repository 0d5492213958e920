"""Job arrays at scale (issue 26, item 2): one submission of 10,000 tasks, and a round with 10,000 waiting tasks.

    python -m benchmarks.bench_arrays [--tasks 10000] [--rounds 10] [--write BENCHMARKS.md]
    python -m benchmarks.bench_arrays --ack [--repeat 9]

`--ack`: only the acknowledgement, by the array's size (a single job; arrays of 1, 100, 1,000 and 10,000 tasks):
the median wall and CPU time of `--repeat` submissions each, in-process as below, each on a daemon whose other
tasks were cancelled (so the store, not the queue, grows): what the daemon adds to a CLI's start per task.

Submission: `POST /v1/jobs` with `"array": "0-9999"` through the API (in-process, the daemon core over an SQLite
store in a temporary folder, fsync on as in `corral serve`), timed from the request to the answer; beside it the
same 10,000 jobs submitted one request each, and the bytes each way adds to the store's file and WAL. The spec is
a realistic one: a command, 40 environment variables (about 2 KB, as a login shell exports).

Round: `Daemon.tick` on 4 simulated H100s, all four held by one running job, with 10,000 waiting 1-GPU jobs behind it
(so every round looks at each and explains why it waits): one array of 10,000 tasks, 10,000 single jobs of the same
spec, and the array with `%8`. First round (every reason new: one write), then the median of `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from benchmarks.bench_engine import cpu_name, emit, memory_gib
from corral.api.app import create_app
from corral.daemon.core import Daemon
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.placement import PlacementConfig
from corral.store import SqliteStore
from tests.api.test_api import ALICE, AsPeer

ENV = {f"VAR_{i}": f"/opt/software/package-{i}/lib:/usr/local/lib/{i}" for i in range(40)}


def body(**extra: Any) -> dict[str, Any]:
    return {"command": ["python", "train.py", "--lr", "3e-4"], "gpus": 1, "env": ENV, "cwd": "/home/alice", **extra}


class World:
    """An in-process `corral serve` over SQLite: the API, the daemon core, a fake executor."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.store = SqliteStore(folder / "jobs.db")
        node = parse_simulated_inventory("4xH100-80GB")[0]
        self.daemon = Daemon(self.store, FakeExecutor(), node, PlacementConfig(), folder)
        self.lock = threading.Lock()
        app = create_app(self.daemon, self.lock, lambda: None)
        self.api = TestClient(AsPeer(app, ALICE, "unix"))

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("jobs.db*"))

    def tick(self) -> float:
        t = time.perf_counter()
        with self.lock:
            self.daemon.tick()
        return time.perf_counter() - t


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def submission(tasks: int, singles: int) -> dict[str, float]:
    """The array's submission, then hold, release, show and cancel of it; `singles` single submissions beside."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        world.api.post("/v1/jobs", json=body())  # warm: the first request builds the app's routes
        before = world.size()
        answer: list[Any] = []
        out["array_s"] = timed(lambda: answer.append(world.api.post("/v1/jobs", json=body(array=f"0-{tasks - 1}"))))
        assert answer[0].status_code == 201, answer[0].text
        out["array_bytes"] = world.size() - before
        array_id = answer[0].json()["id"]
        out["hold_s"] = timed(lambda: world.api.post(f"/v1/jobs/{array_id}/hold"))
        out["release_s"] = timed(lambda: world.api.post(f"/v1/jobs/{array_id}/release"))
        out["show_s"] = timed(lambda: world.api.get(f"/v1/jobs/{array_id}"))
        out["cancel_s"] = timed(lambda: world.api.post(f"/v1/jobs/{array_id}/cancel"))
    if not singles:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        world.api.post("/v1/jobs", json=body())
        before = world.size()
        out["singles_s"] = timed(lambda: [world.api.post("/v1/jobs", json=body()) for _ in range(singles)])
        out["singles_bytes"] = world.size() - before
    return out


def acks(repeat: int) -> dict[str, tuple[float, float]]:
    """Per size: the median (wall, CPU) seconds from the request to the answer of `repeat` submissions."""
    sizes = {"a single job": None, "an array of 1": "0", "of 100": "0-99", "of 1,000": "0-999", "of 10,000": "0-9999"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        world.api.post("/v1/jobs", json=body())  # warm: the first request builds the app's routes
        samples: dict[str, list[tuple[float, float]]] = {label: [] for label in sizes}
        for _ in range(repeat):
            for label, text in sizes.items():  # alternating, so that a burst of load falls on each alike
                wall, cpu = time.perf_counter(), time.process_time()
                r = world.api.post("/v1/jobs", json=body() if text is None else body(array=text))
                samples[label].append((time.perf_counter() - wall, time.process_time() - cpu))
                assert r.status_code == 201, r.text
                world.api.post(f"/v1/jobs/{r.json()['id']}/cancel")
        for label, got in samples.items():
            out[label] = (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
    return out


def world_with(folder: Path, tasks: int, how: str) -> World:
    """A daemon with `tasks` waiting 1-GPU jobs (`how`: singles, array, throttled) behind one holding all 4 GPUs."""
    world = World(folder)
    world.api.post("/v1/jobs", json=body(gpus=4))
    world.tick()  # it runs, holding every GPU
    if how == "singles":
        spec = world.store.list()[0].spec
        spec = dataclasses.replace(spec, request=dataclasses.replace(spec.request, gpu_count=1))
        world.store._conn.execute("PRAGMA synchronous = OFF")  # the set-up only: 10,000 fsyncs are not measured
        for _ in range(tasks):
            world.store.add(spec, time.time())
        world.store._conn.execute("PRAGMA synchronous = FULL")
    else:
        text = f"0-{tasks - 1}" + ("%8" if how == "throttled" else "")
        assert world.api.post("/v1/jobs", json=body(array=text)).status_code == 201
    return world


def cpu_tick(world: World) -> tuple[float, float]:
    """(wall, CPU) seconds of one round: the CPU time is this process's, so other sessions' load counts less."""
    wall, cpu = time.perf_counter(), time.process_time()
    world.tick()
    return time.perf_counter() - wall, time.process_time() - cpu


def rounds(tasks: int, count: int) -> dict[str, dict[str, float]]:
    """Per way (singles, array, throttled): the first round and the median of `count` more, wall and CPU; the ways'
    rounds alternate, so that a burst of load on the machine falls on each alike."""
    hows = ("singles", "array", "throttled")
    with tempfile.TemporaryDirectory() as tmp:
        worlds = {}
        for how in hows:
            (Path(tmp) / how).mkdir()
            worlds[how] = world_with(Path(tmp) / how, tasks, how)
        first = {how: cpu_tick(worlds[how]) for how in hows}
        later: dict[str, list[tuple[float, float]]] = {how: [] for how in hows}
        for _ in range(count):
            for how in hows:
                later[how].append(cpu_tick(worlds[how]))
        return {
            how: {
                "first_wall": first[how][0],
                "first_cpu": first[how][1],
                "wall": statistics.median(w for w, _ in later[how]),
                "cpu": statistics.median(c for _, c in later[how]),
            }
            for how in hows
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--singles", type=int, default=1000, help="single submissions to compare with (fsync each)")
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--ack", action="store_true", help="only the acknowledgement, by the array's size")
    parser.add_argument("--repeat", type=int, default=9, help="--ack: submissions of each size")
    args = parser.parse_args(argv)
    if args.ack:
        load = os.getloadavg()
        got = acks(args.repeat)
        print(f"acknowledged in (median of {args.repeat}, wall / CPU; load {load[0]:.1f} before, "
              f"{os.getloadavg()[0]:.1f} after):")  # fmt: skip
        for label, (wall, cpu) in got.items():
            print(f"  {label}: {wall * 1000:.1f} / {cpu * 1000:.1f} ms")
        return
    load = os.getloadavg()
    subs = [submission(args.tasks, args.singles if k == 0 else 0) for k in range(3)]
    sub = {
        **subs[0],
        **{k: statistics.median(s[k] for s in subs) for k in ("array_s", "hold_s", "release_s", "show_s", "cancel_s")},
    }
    spread = {k: (min(s[k] for s in subs), max(s[k] for s in subs)) for k in ("array_s",)}
    measured = rounds(args.tasks, args.rounds)
    load_after = os.getloadavg()
    n = f"{args.tasks:,}"
    text = f"""## Job arrays: one submission of {n} tasks, and a round with {n} waiting (issue 26, item 2; \
{datetime.date.today()})

- machine: {cpu_name()}, {os.cpu_count()} cores, {memory_gib()}; Python {platform.python_version()}; load \
{load[0]:.1f} before, {load_after[0]:.1f} after (shared with other sessions); `python -m benchmarks.bench_arrays \
--tasks {args.tasks} --rounds {args.rounds} --singles {args.singles}`
- in-process API and daemon core over SQLite (fsync on), fake executor, 4 simulated H100s; a spec with 40
  environment variables (about 2 KB)

| submission | acknowledged in | added to the store (file + WAL) |
|---|---:|---:|
| one array, `"array": "0-{args.tasks - 1}"` (median of 3; range) | {sub["array_s"]:.3f} s \
({spread["array_s"][0]:.3f}-{spread["array_s"][1]:.3f}) | {sub["array_bytes"] / 1e6:.1f} MB |
| {args.singles:,} single jobs, one request each | {sub["singles_s"]:.1f} s | {sub["singles_bytes"] / 1e6:.1f} MB |

The same array of {n} waiting tasks, each action one durable write: `hold` {sub["hold_s"]:.2f} s (each task's hold
and history kept in its stub), `release` {sub["release_s"]:.2f} s, `cancel` {sub["cancel_s"]:.2f} s; `GET /v1/jobs/ID`
(its tasks counted) {sub["show_s"] * 1000:.0f} ms.

| round, {n} waiting 1-GPU jobs behind one holding all 4 GPUs | first round (wall / CPU) | median of {args.rounds} \
after (wall / CPU) |
|---|---:|---:|
"""
    for how, label in (("singles", f"{n} single jobs"), ("array", f"one array of {n} tasks"),
                       ("throttled", f"one array of {n} tasks, `%8`")):  # fmt: skip
        m = measured[how]
        text += (
            f"| {label} | {m['first_wall'] * 1000:.0f} / {m['first_cpu'] * 1000:.0f} ms | "
            f"{m['wall'] * 1000:.1f} / {m['cpu'] * 1000:.1f} ms |\n"
        )
    emit(text, args.write)


if __name__ == "__main__":
    main()
