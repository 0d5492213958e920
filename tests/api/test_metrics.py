"""/metrics, /healthz and /readyz: scraped from a live `corral serve` and from in-process daemons, parsed with
prometheus_client's own parser, and checked against what the jobs really hold."""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from corral.metrics import render_daemon
from corral.store import StoreError
from tests.api.test_serve import CLI, serving, wait_for
from tests.daemon.test_gpu_use import World as GpuWorld
from tests.daemon.test_gpu_use import over_its_grant


def parse(text: str) -> dict[str, list[Sample]]:
    """Samples by name (counters' `_total`, histograms' `_bucket`/`_count` included)."""
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The one sample of `name` with these labels (0 when there is none: counters start absent)."""
    hits = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) <= 1, f"{name}{labels}: {len(hits)} samples, want one"
    return hits[0].value if hits else 0.0


def total(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[httpx.Client, str]]:
    """A real `corral serve` (2 simulated A100s, TCP on a free port): an httpx client on its socket, and its URL."""
    sock = tmp_path / "corral.sock"
    with serving(sock, tmp_path / "state", "--listen", "127.0.0.1:0") as (_, first):
        found = re.search(r"and (http://127\.0\.0\.1:\d+) \(bearer tokens\)", first)
        assert found, first
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=10) as c:
            yield c, found.group(1)


def test_live_scrape_matches_what_the_jobs_hold(live: tuple[httpx.Client, str]) -> None:
    c, _ = live
    shared = {"command": ["sleep", "60"], "gpus": 1, "gpu_fraction": 0.3, "gpu_memory": "10GiB"}
    for body in (shared, {"command": ["sleep", "60"], "gpus": 1}, {"command": ["sleep", "60"], "gpus": 2}):
        assert c.post("/v1/jobs", json=body).status_code == 201
    assert c.post("/v1/jobs", json={"command": ["false"]}).status_code == 201  # fails: exit code 1

    def jobs() -> dict[str, dict[str, object]]:
        return {j["id"]: j for j in c.get("/v1/jobs").json()}

    wait_for("two jobs running and one failed", lambda: [j["state"] for j in jobs().values()].count("running") == 2)
    wait_for("job 4 to fail", lambda: jobs()["4"]["state"] == "failed")
    m = parse(c.get("/metrics").text)

    assert value(m, "corral_gpus", modelName="A100") == 2
    assert len(m["DCGM_FI_DEV_FB_TOTAL"]) == 2 and {s.value for s in m["DCGM_FI_DEV_FB_TOTAL"]} == {80 * 1024}
    # what the running jobs hold, from the API, against the scrape
    running = [j for j in jobs().values() if j["state"] == "running"]
    held_milli = sum(g["milli"] for j in running for g in j["gpus"])  # type: ignore[attr-defined]
    assert held_milli == 1300
    assert total(m, "corral_gpu_granted_milli") == held_milli
    assert value(m, "corral_node_granted", resource="gpu_milli") == held_milli
    assert total(m, "corral_gpu_granted_memory_mib") == 80 * 1024 + 10 * 1024  # the whole GPU's memory + 10 GiB
    assert total(m, "GPUDeviceMemoryAllocated") == (80 + 10) * 1024**3  # HAMi's, in bytes
    assert total(m, "GPUDeviceCoreAllocated") == 130  # HAMi's, in percent of a GPU
    assert value(m, "GPUDeviceSharedNum", deviceidx="0") == 1 and value(m, "GPUDeviceSharedNum", deviceidx="1") == 1
    # queue length by state, queue and user (the test runs as root)
    assert value(m, "corral_jobs", state="running", queue="default", user="root") == 2
    assert value(m, "corral_jobs", state="queued", queue="default", user="root") == 1
    # per job, for root: the allocation of each running job, by job id
    per_job = {s.labels["job"]: s.value for s in m["corral_job_gpu_milli"]}
    assert per_job == {j["id"]: sum(g["milli"] for g in j["gpus"]) for j in running}  # type: ignore[attr-defined]
    assert {s.labels["podname"] for s in m["vGPUMemoryAllocated"]} == set(per_job)
    # events: three starts (the failing job too), their latency, decisions, the failure by cause
    assert value(m, "corral_jobs_started_total") == 3
    assert value(m, "corral_scheduling_latency_seconds_count") == 3
    assert value(m, "corral_scheduling_latency_seconds_bucket", le="+Inf") == 3
    assert value(m, "corral_schedule_attempts_total", policy="binpack", result="placed") == 3
    assert value(m, "corral_schedule_attempts_total", policy="binpack", result="unschedulable") >= 1  # the 2-GPU job
    assert value(m, "corral_jobs_ended_total", state="failed", cause="exit_code") == 1
    ratio = value(m, "corral_gpu_fragmentation_ratio")
    assert 0 <= ratio <= 0.7  # at most the 0.7 GPU left idle on GPU 0, of 2 GPUs' compute
    assert value(m, "corral_gpu_fragmentation_milli") == pytest.approx(ratio * 2000)

    # a cancel while queued counts as an end; the queue empties
    assert c.post("/v1/jobs/3/cancel").status_code == 200
    m = parse(c.get("/metrics").text)
    assert value(m, "corral_jobs_ended_total", state="cancelled", cause="cancelled") == 1
    assert value(m, "corral_jobs", state="queued", queue="default", user="") == 0


def test_job_level_series_are_for_root_and_probes_need_no_token(live: tuple[httpx.Client, str]) -> None:
    c, url = live
    assert c.post("/v1/jobs", json={"command": ["sleep", "60"], "gpus": 1}).status_code == 201
    made = c.post("/v1/tokens", json={"name": "prometheus", "user": "nobody"})
    assert made.status_code == 201, made.text
    secret = made.json()["token"]
    wait_for("the job to run", lambda: c.get("/v1/jobs/1").json()["state"] == "running")

    assert httpx.get(f"{url}/metrics").status_code == 401  # a scrape over TCP needs a token
    scraped = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {secret}"})
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = parse(scraped.text)
    assert value(m, "corral_gpu_granted_milli", gpu="0") == 1000  # the machine's state: for everyone
    assert value(m, "corral_jobs", state="running", user="root") == 1  # queue counts per user: for everyone
    assert not [name for name in m if name.startswith(("corral_job_", "vGPU"))]  # job ids: root only
    assert "corral_job_gpu_milli" in parse(c.get("/metrics").text)

    # the probes answer anyone, over TCP without a token too
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}


def test_readyz_says_what_is_not_ready(tmp_path: Path) -> None:
    from tests.api.test_api import World

    w = World(tmp_path)
    c = w.client(None)
    r = c.get("/readyz")  # no round has run yet
    assert r.status_code == 503
    assert r.json() == {
        "status": "not ready",
        "problems": ["the scheduling loop is not running: no round has ended yet"],
    }
    w.tick()
    assert c.get("/readyz").json() == {"status": "ready"}
    assert c.get("/healthz").status_code == 200
    assert c.get("/metrics").status_code == 401  # /metrics needs a caller; the probes do not

    def failing(job_id: str) -> None:
        raise StoreError("database is locked")

    w.daemon.store.get = failing  # type: ignore[method-assign]
    r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["problems"] == ["the job store fails: StoreError: database is locked"]


def test_watchdog_kills_are_counted(tmp_path: Path) -> None:
    w = over_its_grant(tmp_path, "kill")  # job 1: 4096 MiB granted, 5000 MiB used
    assert value(parse(render_daemon(w.d, jobs=True).decode()), "corral_gpu_memory_watchdog_actions_total") == 0
    w.later()  # sampled: over its grant, killed
    m = parse(render_daemon(w.d, jobs=True).decode())
    assert value(m, "corral_job_gpu_memory_used_mib", job="1") == 5000  # the sample the watchdog acted on
    w.later()  # its exit recorded
    m = parse(render_daemon(w.d, jobs=True).decode())
    assert value(m, "corral_gpu_memory_watchdog_actions_total", action="kill") == 1
    assert value(m, "corral_jobs_ended_total", state="failed", cause="gpu_memory_watchdog") == 1
    # live use from the sample, with DCGM's names
    assert value(m, "DCGM_FI_DEV_GPU_UTIL", gpu="1") == 10
    warned = over_its_grant(tmp_path / "warn", "warn")
    warned.later()
    warned.later()  # warned once, not every round
    m = parse(render_daemon(warned.d, jobs=False).decode())
    assert value(m, "corral_gpu_memory_watchdog_actions_total", action="warn") == 1
    assert value(m, "corral_gpu_memory_watchdog_actions_total", action="kill") == 0


def test_each_daemon_has_its_own_registry(tmp_path: Path) -> None:
    a, b = GpuWorld(tmp_path / "a"), GpuWorld(tmp_path / "b")
    a.submit()
    a.later()
    assert value(parse(render_daemon(a.d, jobs=False).decode()), "corral_jobs_started_total") == 1
    assert value(parse(render_daemon(b.d, jobs=False).decode()), "corral_jobs_started_total") == 0


def test_starts_ends_and_refusals_are_logged_once_per_cause(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from corral.daemon.core import Daemon
    from corral.executor.fake import FakeExecutor
    from corral.jobs.model import JobSpec
    from corral.model.errors import InvalidRequest
    from corral.model.resources import Request
    from corral.placement import PlacementConfig
    from corral.store import MemoryStore
    from tests.builders import node
    from tests.daemon.test_core import Clock

    box = node("box").gpus(2, memory_gib=80).cpu(64).mem(256).build()
    ex = FakeExecutor()
    d = Daemon(MemoryStore(), ex, box, PlacementConfig(), tmp_path, clock=Clock())  # preferential: notes on CPU jobs
    caplog.set_level(logging.INFO, logger="corral.daemon")
    for _ in range(3):
        d.submit(JobSpec(("cpu.py",), Request(cpu_milli=1000, memory_mib=1024), "alice", 1000, 1000))
    three_gpus = JobSpec(("big.py",), Request(gpu_count=3, gpu_milli=1000), "bob", 1001, 1001)
    with pytest.raises(InvalidRequest, match="can never run on this machine"):
        d.submit(three_gpus)
    assert sorted(d.tick()) == ["1", "2", "3"]
    ex.finish("2", exit_code=3)
    d.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("refused a job of bob (uid 1001): request: can never run on this machine: ") for line in lines
    )
    assert value(parse(render_daemon(d, jobs=False).decode()), "corral_jobs_refused_total", reason="request") == 1
    for i in "123":
        started = [line for line in lines if line.startswith(f"job {i} of alice started")]
        assert len(started) == 1 and re.fullmatch(rf"job {i} of alice started \(pid \d+, GPUs none\)", started[0])
    assert "job 2 of alice ended: failed (exit code 3)" in lines
    notes = [line for line in lines if "placed on a GPU node" in line]
    assert len(notes) == 1, notes  # three CPU-only jobs, one note
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum("started" in line or "ended" in line or "refused" in line for line in infos) == 5


def test_serve_logs_starts_ends_and_refusals_on_stderr(tmp_path: Path) -> None:
    sock, out = tmp_path / "corral.sock", tmp_path / "serve.out"
    command = [*CLI, "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(tmp_path / "state")]
    with out.open("w") as sink:
        server = subprocess.Popen([*command, "--socket", str(sock)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None, timeout=15)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=10) as c:
            for _ in range(2):  # CPU-only work on a GPU machine: the "preferential" note, said once
                assert c.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
            assert c.post("/v1/jobs", json={"command": ["true"], "gpus": 2}).status_code == 422
            wait_for("both ends in the log", lambda: out.read_text().count("ended: succeeded (exit code 0)") == 2)
    finally:
        server.terminate()
        server.wait(timeout=15)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("corral serve: listening on ")  # the logs come after the line clients wait for
    for job in ("1", "2"):
        assert any(
            re.search(rf"INFO corral.daemon: job {job} of root started \(pid \d+, GPUs none\)$", x) for x in lines
        )
        assert any(x.endswith(f"INFO corral.daemon: job {job} of root ended: succeeded (exit code 0)") for x in lines)
    assert any(
        "INFO corral.daemon: refused a job of root (uid 0): request: can never run on this machine" in x for x in lines
    )
    assert sum("placed on a GPU node" in x for x in lines) == 1


def test_outcomes_a_restart_finds_are_logged_after_the_listening_line(tmp_path: Path) -> None:
    sock, state = tmp_path / "corral.sock", tmp_path / "state"
    command = [*CLI, "serve", "--simulate-gpus", "1xA100-80GB", "--state-dir", str(state), "--socket", str(sock)]

    def start(out: Path) -> subprocess.Popen[bytes]:
        with out.open("w") as sink:
            server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        wait_for("the socket", lambda: sock.exists() or server.poll() is not None, timeout=15)
        return server

    def client() -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral", timeout=10)

    first = start(tmp_path / "first.out")
    try:
        with client() as c:
            assert c.post("/v1/jobs", json={"command": ["sleep", "1"]}).status_code == 201
            wait_for("the job to run", lambda: c.get("/v1/jobs/1").json()["state"] == "running")
    finally:
        first.kill()  # the daemon dies; the job's supervisor records its exit (see corral.executor.local)
        first.wait(timeout=15)
    sock.unlink()
    record = state / "run" / "1.1.json"
    wait_for("the supervisor's record of the end", lambda: '"ended": true' in record.read_text())
    second = start(tmp_path / "second.out")
    try:
        with client() as c:
            assert c.get("/v1/jobs/1").json()["state"] == "succeeded"  # the restart read the supervisor's record
    finally:
        second.terminate()
        second.wait(timeout=15)
    lines = (tmp_path / "second.out").read_text().splitlines()
    assert lines[0].startswith("corral serve: listening on ")  # held until the line clients wait for is out
    assert any(x.endswith("INFO corral.daemon: job 1 of root ended: succeeded (exit code 0)") for x in lines[1:])
