"""A new user's first day (issue 23, items 9 and 10): whatever `corral submit` is given ends in a job or a 4xx with a
message, never a 5xx; and the README's examples work on the README's default machine.

One daemon for the module, as `python3 dev.py run` starts it (4 simulated H100-80GB), with examples/queues.toml as
its queues file, gangs (GangExecutor over the fake executor) and the peers' faces. Every submission goes through the
CLI itself: its argv is parsed by `corral submit`'s click command and its body built by `submit_body`, then posted
as the CLI posts it (json.dumps, as corral.cli.transport does).
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.api.app import create_app
from corral.cli.client import submit_body, submit_cmd
from corral.daemon.core import Daemon
from corral.daemon.extensions import install_extensions
from corral.daemon.gang import GangExecutor
from corral.daemon.queues import Queues
from corral.executor.fake import FakeExecutor
from corral.gpu.simulated import parse_simulated_inventory
from corral.jobs.model import JobState
from corral.model.resources import Node
from corral.placement import PlacementConfig
from corral.store import MemoryStore
from corral.tenancy.config import QueueConfigError
from tests.api.test_api import ALICE, ROOT, AsPeer

REPO = Path(__file__).resolve().parents[2]
ANN = (1002, 1002, "ann")  # an admin of examples/queues.toml


def readme_default() -> str:
    """The inventory `python3 dev.py run` simulates on a machine without a driver (what the README promises)."""
    m = re.search(r'"--simulate-gpus", "([^"]+)"', (REPO / "dev.py").read_text())
    assert m is not None, "dev.py no longer names its simulated inventory"
    assert f"simulated inventory of {m[1].replace('x', ' x ', 1)}" in (REPO / "README.md").read_text()
    return m[1]


def default_node() -> Node:
    return parse_simulated_inventory(readme_default())[0]


class FirstDay:
    """An empty daemon on the README's default machine, with examples/queues.toml."""

    def __init__(self) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="corral-first-day-"))
        node = default_node()
        self.store = MemoryStore()
        self.fake = FakeExecutor()
        executor = GangExecutor(self.fake, lambda jid: j.spec.instances if (j := self.store.get(jid)) else 1)
        queues = Queues.open(REPO / "examples" / "queues.toml", node)
        self.daemon = Daemon(self.store, executor, node, PlacementConfig(), self.state, queues=queues)
        self.lock = threading.Lock()
        routers = install_extensions(self.daemon, self.lock, self.wake)
        self.app = create_app(self.daemon, self.lock, self.wake, routers=routers)

    def wake(self) -> None:
        pass

    def tick(self) -> None:
        with self.lock:
            self.daemon.tick()

    def client(self, peer: tuple[int, int, str]) -> TestClient:
        return TestClient(AsPeer(self.app, peer, "unix"), raise_server_exceptions=False)

    def empty(self) -> None:
        """Cancel whatever runs or waits, so the next example meets an empty machine again."""
        with self.lock:
            for job in self.store.list([JobState.QUEUED, JobState.STARTING, JobState.RUNNING]):
                self.daemon.cancel(job.id)
        for _ in range(3):
            self.tick()
        assert not self.store.list([JobState.STARTING, JobState.RUNNING])


@pytest.fixture(scope="module")
def first_day() -> Iterator[FirstDay]:
    yield FirstDay()


def cli_body(argv: list[str]) -> dict[str, Any]:
    """What `corral submit ARGV` sends: click parses the options, `submit_body` builds the body."""
    with submit_cmd.make_context("submit", list(argv)) as ctx:
        params = dict(ctx.params)
    params.pop("socket")
    return submit_body(**params)


def post_as_cli(c: TestClient, body: dict[str, Any]) -> Any:
    return c.post("/v1/jobs", content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


# ------------------------------------------------------------------------------------------------ item 9
@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu-memory", "10GiB", "--", "sleep", "5"],
        ["--gpus", "1", "--gpu-memory", "10GiB", "--", "sleep", "5"],
        ["--cpus", "1", "--gpu-memory", "10GiB", "--", "sleep", "5"],
        ["--gpu-memory", "10GiB", "--instances", "3", "--gang", "--", "sleep", "5"],
        ["--gpus", "2", "--gpu-memory", "10GiB", "--instances", "2", "--gang", "--", "sleep", "5"],
    ],
)
def test_a_share_by_gpu_memory_alone_makes_a_job(first_day: FirstDay, argv: list[str]) -> None:
    """Was `error: server: internal error: AllocationError`: admission held the rest of the share's GPU as a grant of
    1000 milli, which the snapshot takes for a whole GPU (corral.daemon.gang.place_gang)."""
    r = post_as_cli(first_day.client(ALICE), cli_body(argv))
    assert r.status_code == 201, r.text
    first_day.tick()
    job = first_day.store.get(r.json()["id"])
    assert job is not None and job.state is JobState.RUNNING, job
    n = job.spec.instances
    assert sorted(g.index for g in job.gpus) == sorted({g.index for g in job.gpus})  # instances never share a GPU
    assert [g.memory_mib for g in job.gpus] == [10240] * (n * job.spec.request.gpu_count)
    first_day.empty()


# Each option with values a user might type: good ones, edges, and wrong ones.
_OPTIONS: dict[str, st.SearchStrategy[list[str]]] = {
    "--gpus": st.sampled_from(["0", "1", "2", "4", "5", "-1", "1000000", "0.5", "x"]).map(lambda v: ["--gpus", v]),
    "--gres": st.sampled_from(["gpu:1", "gpu:H100-80GB:2", "gpu:A100:1", "gpu:0", "gpu", "mps:1", "gpu::1"]).map(
        lambda v: ["--gres", v]
    ),
    "--dependency": st.sampled_from(
        ["afterok:1", "afterany:1:2", "singleton", "after:1", "bogus:1", "afterok:99999"]
    ).map(lambda v: ["--dependency", v]),
    "--kill-on-invalid-dep": st.just(["--kill-on-invalid-dep"]),
    "--gpu-fraction": st.one_of(
        st.sampled_from(["0", "0.3", "0.5", "1", "1.5", "-0.5", "1e-9", "nan", "inf"]),
        st.floats(-1, 2, allow_nan=False).map(repr),
    ).map(lambda v: ["--gpu-fraction", v]),
    "--gpu-memory": st.sampled_from(
        ["10GiB", "1GiB", "80GiB", "81GiB", "500MiB", "0", "10", "1e9GiB", "lots", "-1GiB", "", "10gib", "0.5GiB"]
    ).map(lambda v: ["--gpu-memory", v]),
    "--cpus": st.sampled_from(["1", "500m", "0", "32", "33", "0.5", "-1", "abc", "1e30", "0m"]).map(
        lambda v: ["--cpus", v]
    ),
    "--memory": st.sampled_from(["1GiB", "0", "256GiB", "300GiB", "512MiB", "x", "1e40"]).map(
        lambda v: ["--memory", v]
    ),
    "--gpu-model": st.lists(st.sampled_from(["H100-80GB", "H100", "A100-80GB", "", "h100-80gb"]), max_size=2).map(
        lambda ms: [a for m in ms for a in ("--gpu-model", m)]
    ),
    "--priority": st.sampled_from(["0", "5", "10", "11", "50", "-100", "101", "-2147483649", "99999999999"]).map(
        lambda v: ["--priority", v]
    ),
    "--name": st.text(max_size=8).map(lambda v: ["--name", v]),
    "--queue": st.sampled_from(["dev", "train", "default", "nope", "", "a b"]).map(lambda v: ["--queue", v]),
    "--retries": st.sampled_from(["0", "3", "-1", "1000000000000"]).map(lambda v: ["--retries", v]),
    "--time-limit": st.sampled_from(
        ["90", "45m", "2h", "0", "-1", "soon", "1e20", "1.5h", "3d", "1:30:00", "2-12"]
    ).map(lambda v: ["--time-limit", v]),
    "--no-preempt": st.just(["--no-preempt"]),
    "--instances": st.sampled_from(["1", "2", "3", "4", "5", "0", "-1", "64", "65"]).map(lambda v: ["--instances", v]),
    "--gang": st.just(["--gang"]),
}

argvs = st.lists(st.sampled_from(sorted(_OPTIONS)), unique=True, max_size=6).flatmap(
    lambda names: st.tuples(*(_OPTIONS[n] for n in names)).map(lambda parts: [a for p in parts for a in p])
)


@given(argv=argvs, peer=st.sampled_from([ALICE, ANN, ROOT]))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_mix_of_submit_options_ends_in_a_job_or_a_4xx(
    first_day: FirstDay, argv: list[str], peer: tuple[int, int, str]
) -> None:
    try:
        body = cli_body([*argv, "--", "sleep", "5"])
    except click.ClickException as exc:  # the CLI itself refuses it (--instances abc): a usage error naming the flag
        assert exc.format_message()
        return
    except SystemExit as exc:  # or its own error line (--gpus abc, --gpus 0.5: corral.cli.client.gpu_count)
        assert exc.code == 2
        return
    r = post_as_cli(first_day.client(peer), body)
    assert r.status_code < 500, f"corral submit {shlex.join(argv)}: {r.status_code} {r.text}"
    if r.status_code in (200, 201):
        first_day.tick()  # the round places it (or says why not): no exception either
        job = first_day.store.get(r.json()["id"])
        # cancelled only by --kill-on-invalid-dep, when its dependency can never be met
        ended = (JobState.CANCELLED,) if "--kill-on-invalid-dep" in argv else ()
        assert job is not None and job.state in (JobState.QUEUED, JobState.RUNNING, *ended), job
        first_day.empty()
        return
    assert 400 <= r.status_code < 500
    detail = r.json()["detail"]
    assert isinstance(detail, dict) and detail["message"] and "field" in detail, r.text


# ------------------------------------------------------------------------------------------------ item 10
def queues_examples() -> list[Path]:
    return sorted(p for p in (REPO / "examples").glob("*.toml") if "[queues." in p.read_text())


def test_every_queues_example_loads_on_the_readme_default() -> None:
    node = default_node()
    files = queues_examples()
    assert REPO / "examples" / "queues.toml" in files
    for path in files:
        try:
            queues = Queues.open(path, node)
        except QueueConfigError as exc:
            pytest.fail(f"{path.name} does not load on the README's default ({readme_default()}): {exc}")
        assert queues.active and queues.config.default_queue in queues.config.queues


def test_the_example_still_shows_what_it_demonstrates() -> None:
    """Guarantees, a limit above the guarantee with a borrow limit, per-user and per-group limits and weights,
    priority bounds, submitters and admins: the features the README points at it for."""
    c = Queues.open(REPO / "examples" / "queues.toml", default_node()).config
    train, dev = c.queues["train"], c.queues["dev"]
    assert train.guarantee.gpus and dev.guarantee.gpus
    assert train.limit.gpus is not None and train.guarantee.gpus is not None
    assert train.limit.gpus > train.guarantee.gpus and train.borrow_limit.gpus
    assert train.submitters and c.admins and train.max_priority is not None
    assert dev.users["bob"].limit.gpu_milli and dev.users["bob"].weight != 1
    assert c.groups["interns"].limit.gpus == 1000  # one GPU, counted in milli (shares count by their part)


#: The README's `corral submit` examples (the synopsis with its [brackets] aside): options, --, a command.
README_SUBMITS = sorted(
    set(re.findall(r"corral submit (--[^\n`#\[]*?-- [^\n`#]*?)\s*(?:#|$|`)", (REPO / "README.md").read_text(), re.M))
)


def test_the_readme_has_submit_examples() -> None:
    assert "--gpu-fraction 0.5 -- python train.py" in README_SUBMITS and len(README_SUBMITS) >= 2


@pytest.mark.parametrize("line", README_SUBMITS)
def test_the_readmes_submit_commands_make_jobs_on_its_default(first_day: FirstDay, line: str) -> None:
    r = post_as_cli(first_day.client(ALICE), cli_body(shlex.split(line)))
    assert r.status_code == 201, f"corral submit {line}: {r.text}"
    first_day.tick()
    job = first_day.store.get(r.json()["id"])
    assert job is not None and job.state is JobState.RUNNING, f"corral submit {line}: {job}"
    first_day.empty()


@pytest.mark.parametrize(
    ("example", "url"),
    [
        ("marathon-app-gpu.json", "/marathon/v2/apps"),
        ("metronome-job.json", "/metronome/v1/jobs"),
        ("chronos-job.json", "/chronos/v1/scheduler/iso8601"),
    ],
)
def test_the_peer_examples_are_accepted_on_the_readmes_default(example: str, url: str) -> None:
    body = (REPO / "examples" / example).read_bytes()
    day = FirstDay()  # its own daemon: an app keeps its instances running
    r = day.client(ALICE).post(url, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code < 300, f"{example}: {r.status_code} {r.text}"
