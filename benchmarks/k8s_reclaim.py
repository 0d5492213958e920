"""Reclaim by preemption on `corral k8s scheduler` against a real kube-apiserver (issue 25's row: "two namespaces'
queues, one below its guarantee: reclaims it by preemption, with no pod evicted twice within the minimum runtime").

    2 nodes x 4 GPUs; queues a (namespace team-a, guarantee 2 GPUs) and b (team-b, guarantee 6), min_runtime M
    1. team-a fills all 8 GPUs (1 GPU pods), which then run M
    2. team-b asks for 6: corral evicts 6 of a's (Eviction API), holds what they free for b's pods, binds them;
       a's "controller" re-creates each evicted pod (same name, a new UID): they wait          -> time to reclaim
    3. b's pods end 3 of theirs: 3 of a's re-created pods bind; b at once asks for 3 again: a's re-created pods are
       within their minimum runtime of their new bind, so b's wait; once it has run, they are evicted
                                                     -> no pod (name) evicted twice within M; the second reclaim's wait

The "kubelet" is the benchmark's: a pod given a deletionTimestamp is deleted (grace 0) KUBELET_DELAY s later; pods'
terminationGracePeriodSeconds is GRACE.

    python -m benchmarks.k8s_reclaim [--min-runtime 10] [--write BENCHMARKS.md]

Needs ../shared/k8s/control-plane.sh (or CORRAL_K8S_CONTROL_PLANE).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import urllib3

from benchmarks._k8s_plane import RUN_LABEL, SchedulerProcess, Writer
from tests.k8s.plane import Plane, gpu_node, pod

GRACE = 2
KUBELET_DELAY = 0.3
NODES = 2
GPUS = 4


def queues_file(min_runtime_s: float) -> str:
    return (f'min_runtime = "{min_runtime_s:g}s"\n'
            '[queues.a]\nnamespaces = ["team-a"]\nguarantee = { gpus = 2 }\n'
            '[queues.b]\nnamespaces = ["team-b"]\nguarantee = { gpus = 6 }\n')  # fmt: skip


@dataclass
class Seen:
    """What the watch saw of every pod (by UID): its name, when it was first bound, when it was first deleting."""

    name: dict[str, str] = field(default_factory=dict)
    namespace: dict[str, str] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    deleting: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)

    finished: set[str] = field(default_factory=set)  # namespace/name of pods the benchmark itself deleted

    def evictions(self) -> list[tuple[str, str, float]]:
        """(namespace/name, uid, when) of each pod that went Terminating (the benchmark's own deletions aside), in
        time order."""
        return sorted(((n, u, t) for u, t in self.deleting.items()
                       if (n := f"{self.namespace[u]}/{self.name[u]}") not in self.finished),
                      key=lambda e: e[2])  # fmt: skip

    def bound_in(self, namespace: str) -> int:
        return sum(1 for u in self.bound if self.namespace[u] == namespace and u not in self.deleted)


class Cluster:
    """The plane's other actors: a kubelet that ends pods given a deletionTimestamp, and team-a's controller that
    re-creates its evicted pods. Both follow one watch of the run's pods in every namespace."""

    def __init__(self, w: Writer, run: str, recreate: bool = True) -> None:
        self.w = w
        self.run = run
        self.recreate = recreate
        self.seen = Seen()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._resp: Any = None
        self._kubelet: list[threading.Timer] = []
        self._rv = str(w.get("/api/v1/pods", labelSelector=f"{RUN_LABEL}={run}", limit="1")["metadata"]
                       ["resourceVersion"])  # fmt: skip
        self.thread = threading.Thread(target=self._watch, daemon=True, name="reclaim-watch")
        self.thread.start()

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        p = pod(name, {"nvidia.com/gpu": "1"}, scheduler="corral", cpu="100m", memory="128Mi")
        p["metadata"]["namespace"] = namespace
        p["metadata"]["labels"] = {RUN_LABEL: self.run}
        p["spec"]["terminationGracePeriodSeconds"] = GRACE
        return p

    def create(self, namespace: str, names: list[str]) -> None:
        self.w.create_pods((self.pod(namespace, n) for n in names), namespace=namespace)

    def _watch(self) -> None:
        while not self.stop.is_set():
            q = urlencode({"watch": "1", "labelSelector": f"{RUN_LABEL}={self.run}", "resourceVersion": self._rv,
                           "timeoutSeconds": "600", "allowWatchBookmarks": "true"})  # fmt: skip
            try:
                timeout = urllib3.Timeout(connect=10, read=None)
                resp = self.w.http.request("GET", f"{self.w.server}/api/v1/pods?{q}", headers=self.w.headers,
                                           preload_content=False, timeout=timeout)  # fmt: skip
            except urllib3.exceptions.HTTPError:
                time.sleep(0.2)
                continue
            self._resp = resp
            buf = b""
            try:
                for chunk in resp.stream(65536):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line:
                            self._event(orjson.loads(line))
            except (urllib3.exceptions.HTTPError, OSError):
                pass
            finally:
                resp.release_conn()

    def _event(self, ev: dict[str, Any]) -> None:
        obj = ev.get("object") or {}
        meta = obj.get("metadata") or {}
        self._rv = meta.get("resourceVersion", self._rv)
        if ev.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        now = time.monotonic()
        with self.lock:
            self.seen.name[uid], self.seen.namespace[uid] = name, ns
            if (obj.get("spec") or {}).get("nodeName"):
                self.seen.bound.setdefault(uid, now)
            if ev["type"] == "DELETED":
                self.seen.deleted.setdefault(uid, now)
            elif meta.get("deletionTimestamp") and uid not in self.seen.deleting:
                self.seen.deleting[uid] = now
                t = threading.Timer(KUBELET_DELAY, self._kubelet_ends, args=(ns, name, uid))
                t.daemon = True
                t.start()
                self._kubelet.append(t)

    def _kubelet_ends(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet: the pod's containers stopped, the pod is deleted for good; team-a's controller re-creates."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        with contextlib.suppress(RuntimeError):
            self.w.request("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body)
        if self.recreate and namespace == "team-a" and not self.stop.is_set():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the name is free once the API server has removed the old pod
                try:
                    self.create(namespace, [name])
                    return
                except RuntimeError:
                    time.sleep(0.1)

    def wait(self, what: str, check: Any, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if check(self.seen):
                    return time.monotonic()
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        self.stop.set()
        for t in self._kubelet:
            t.cancel()
        if self._resp is not None:
            with contextlib.suppress(AttributeError, RuntimeError, OSError):
                self._resp.shutdown()


def reclaim(w: Writer, run: str, min_runtime_s: float) -> dict[str, Any]:
    """The scenario (see the module) on a plane with the scheduler started with queues_file(min_runtime_s)."""
    c = Cluster(w, run)
    try:
        c.create("team-a", [f"a-{i}" for i in range(NODES * GPUS)])
        full = c.wait("team-a on every GPU", lambda s: s.bound_in("team-a") == NODES * GPUS)
        time.sleep(max(0.0, full + min_runtime_s + 0.5 - time.monotonic()))  # a's pods run their minimum runtime
        asked = time.monotonic()
        c.create("team-b", [f"b-{i}" for i in range(6)])
        got = c.wait("team-b's 6 pods bound", lambda s: s.bound_in("team-b") == 6)
        first = len(c.seen.evictions())
        # phase 3: 3 of b's end; 3 of a's re-created pods bind; b asks for 3 again at once
        for i in range(3):
            with c.lock:
                c.seen.finished.add(f"team-b/b-{i}")
            w.request("DELETE", f"/api/v1/namespaces/team-b/pods/b-{i}", {"gracePeriodSeconds": 0})
        c.wait("3 re-created pods of team-a bound", lambda s: s.bound_in("team-a") == 5)
        with c.lock:
            rebound = {u: t for u, t in c.seen.bound.items() if c.seen.namespace[u] == "team-a"
                       and u not in c.seen.deleted and c.seen.name[u] in {n.split("/")[1] for n, _, _ in
                                                                          c.seen.evictions()}}  # fmt: skip
        again = time.monotonic()
        c.create("team-b", [f"b2-{i}" for i in range(3)])
        got2 = c.wait("team-b's 3 new pods bound", lambda s: s.bound_in("team-b") == 6)
        with c.lock:
            evictions = c.seen.evictions()
            bound = dict(c.seen.bound)
    finally:
        c.close()
    # every eviction of a pod came at least min_runtime after that pod's own bind; a name evicted twice was evicted
    # the second time at least min_runtime after its re-created pod's bind
    early = [(n, round(t - bound[u], 2)) for n, u, t in evictions if u in bound and t - bound[u] < min_runtime_s]
    by_name: dict[str, list[float]] = {}
    for n, _, t in evictions:
        by_name.setdefault(n, []).append(t)
    twice_within = [n for n, ts in by_name.items() if any(b - a < min_runtime_s for a, b in itertools.pairwise(ts))]
    uids = [u for _, u, _ in evictions]
    second_wait = min((t for n, u, t in evictions if u in rebound), default=float("nan")) - max(rebound.values())
    return {"case": "two namespaces' queues, one below its guarantee", "min_runtime_s": min_runtime_s,
            "time_to_reclaim_s": round(got - asked, 3), "evictions_first": first, "evictions": len(evictions),
            "evicted_twice_by_uid": len(uids) - len(set(uids)), "evicted_within_min_runtime": early,
            "names_evicted_twice_within": twice_within,
            "names_evicted_twice": sum(1 for ts in by_name.values() if len(ts) > 1),
            "second_reclaim_s": round(got2 - again, 3),
            "second_waited_after_rebind_s": round(second_wait, 3)}  # fmt: skip


def namespaces(w: Writer) -> None:
    for ns in ("team-a", "team-b"):
        w.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                  ok=(200, 201, 409))  # fmt: skip


def main() -> None:
    from benchmarks.k8s_standalone import machine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-runtime", type=float, default=10.0, help="the queues' min_runtime, seconds")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--write", type=Path, help="append the results to this file (BENCHMARKS.md)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="corral-k8s-reclaim-") as tmp:
        where = Path(tmp)
        plane = Plane.find(where / "plane")
        if plane is None:
            raise SystemExit("no control plane: set CORRAL_K8S_CONTROL_PLANE to control-plane.sh")
        sched: SchedulerProcess | None = None
        try:
            w = Writer(plane.up())
            namespaces(w)
            w.create_nodes(gpu_node(f"gpu-{i}", GPUS) for i in range(NODES))
            (where / "queues.toml").write_text(queues_file(args.min_runtime))
            sched = SchedulerProcess(plane.kubeconfig, where / "scheduler.log", "--policy", "binpack",
                                     "--queues", str(where / "queues.toml"))  # fmt: skip
            sched.start(wait=True)
            for k in range(args.runs):
                rows.append(reclaim(w, f"r{k}", args.min_runtime))
                print(rows[-1], flush=True)
                for ns in ("team-a", "team-b"):
                    w.delete_pods(namespace=ns)
            metrics = sched.metrics()
            print({k: v for k, v in metrics.items() if "evictions" in k or "preemptions" in k}, flush=True)
        finally:
            if sched is not None:
                sched.stop()
            plane.down()
    if args.write:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines = [f"\n### Run of {when} ({machine()})\n", "| what | result |", "|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['case']} (min_runtime {r['min_runtime_s']:g} s) | reclaimed 6 GPUs in "
                f"{r['time_to_reclaim_s']} s with {r['evictions_first']} evictions; {r['evictions']} evictions in "
                f"all, of a pod twice: {r['evicted_twice_by_uid']}, within its minimum runtime: "
                f"{len(r['evicted_within_min_runtime'])}; "
                f"{r['names_evicted_twice']} re-created pods evicted again, each >= min_runtime after its new bind "
                f"(the second reclaim waited {r['second_waited_after_rebind_s']} s after their bind; took "
                f"{r['second_reclaim_s']} s) |"
            )
        with args.write.open("a") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
