"""Jobs contained in cgroup v2 leaves (issue 23), with real processes: a setsid'd grandchild, a double fork, 1,000
children, a job trapping SIGTERM; after cancel, time limit or its own end nothing of the job runs by the time its
exit is reported. A supervisor killed with kill -9 does not let the exit (and so the grant) go while the leaf has
processes. The fallback without cgroups, and the v2 limit files against a folder shaped like a cgroup tree."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.executor import Exit, Found, LocalExecutor
from corral.executor.cgroup import Limits, NoCgroups, Subtree, find_v2_mount, own_cgroup, populated, prepare
from corral.executor.local import ORPHANED, _Supervised
from tests.executor.specs import make_spec
from tests.executor.test_local import gone, read_pid, wait_until

CGROUPS = prepare(Path("/nonexistent/probe"))
if isinstance(CGROUPS, Subtree):
    CGROUPS.close()
needs_cgroups = pytest.mark.skipif(
    not isinstance(CGROUPS, Subtree), reason=f"needs a writable cgroup v2 hierarchy: {CGROUPS.notice}"
)
LIMITS = set(CGROUPS.controllers) | {name for name, _ in CGROUPS.v1} if isinstance(CGROUPS, Subtree) else set()
needs_memory = pytest.mark.skipif("memory" not in LIMITS, reason="needs a memory controller (v2, or v1 as root)")
needs_pids = pytest.mark.skipif("pids" not in LIMITS, reason="needs a pids controller (v2, or v1 as root)")


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[LocalExecutor]:
    executor = LocalExecutor(grace_s=0.3, run_dir=tmp_path / "run")
    yield executor
    for job_id in executor.running():
        executor.cancel(job_id, grace_s=0)
    wait_until(lambda: not (executor.poll() or executor.running()), 10)
    executor.close()


def leaf_of(ex: LocalExecutor, job_id: str) -> Path:
    tracked = ex._jobs[job_id]
    assert isinstance(tracked, _Supervised) and tracked.leaf is not None, "the job has no cgroup"
    return tracked.leaf


def procs(leaf: Path) -> list[int]:
    try:
        return [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def end_with_nothing_left(ex: LocalExecutor, job_id: str, leaf: Path, pids: list[int], timeout: float = 15) -> Exit:
    """Poll until the job's exit comes; at that moment its leaf is empty and every pid is gone."""
    found: list[Exit] = []

    def ended() -> bool:
        for e in ex.poll():
            assert e.job_id == job_id
            assert procs(leaf) == [] and not populated(str(leaf)), "the exit came while the cgroup had processes"
            alive = [p for p in pids if not gone(p)]
            assert alive == [], f"the exit came while processes of the job ran: {alive}"
            found.append(e)
        return bool(found)

    assert wait_until(ended, timeout), f"job {job_id} did not end (left in its cgroup: {procs(leaf)})"
    assert not leaf.exists(), "the empty leaf is removed"
    return found[0]


# ------------------------------------------------------------------------------------------------ escapes
@needs_cgroups
def test_cancel_kills_a_setsid_grandchild(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "escaped.pid"
    ex.launch(
        make_spec(tmp_path, "j", "bash", "-c", f"setsid bash -c 'echo $$ > {pidfile}; exec sleep 120' & sleep 300")
    )
    escaped = read_pid(pidfile)
    leaf = leaf_of(ex, "j")
    assert escaped in procs(leaf) and os.getsid(escaped) == escaped  # its own session, yet in the job's cgroup
    ex.cancel("j", grace_s=1)
    ended = end_with_nothing_left(ex, "j", leaf, [escaped])
    assert ended.cancelled


@needs_cgroups
def test_time_limit_kills_a_double_fork(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    command = f"( ( sleep 120 & echo $! > {pidfile} ) & ); sleep 300"  # the grandchild is re-parented to init
    ex.launch(make_spec(tmp_path, "j", "bash", "-c", command, time_limit_s=0.5))
    orphan = read_pid(pidfile)
    leaf = leaf_of(ex, "j")
    assert orphan in procs(leaf)
    ended = end_with_nothing_left(ex, "j", leaf, [orphan])
    assert ended.timed_out


@needs_cgroups
def test_a_thousand_children_die_with_the_job(ex: LocalExecutor, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = f"for i in $(seq 1000); do setsid sleep 300 & done; touch {ready}; wait"
    ex.launch(make_spec(tmp_path, "j", "bash", "-c", command))
    leaf = leaf_of(ex, "j")
    assert wait_until(lambda: ready.exists() and len(procs(leaf)) >= 1001, 60)
    children = procs(leaf)
    ex.cancel("j", grace_s=0)
    end_with_nothing_left(ex, "j", leaf, children, timeout=60)


@needs_cgroups
def test_a_job_trapping_sigterm_gets_it_then_is_killed_with_its_children(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        f"setsid bash -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done' & "
        'trap "echo got TERM" TERM; echo ready; while :; do sleep 0.05; done'
    )
    spec = make_spec(tmp_path, "j", "bash", "-c", script)
    ex.launch(spec)
    child = read_pid(pidfile)
    assert wait_until(lambda: "ready" in spec.log_path.read_text())
    leaf = leaf_of(ex, "j")
    ex.cancel("j", grace_s=0.5)
    ended = end_with_nothing_left(ex, "j", leaf, [child])
    assert ended == Exit("j", None, signal.SIGKILL, False, cancelled=True)
    assert "got TERM" in spec.log_path.read_text()  # asked politely first, setsid or not


def test_sigterm_reaches_each_process_of_a_job_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel's SIGTERM goes to the job's process group and to every process of its cgroup outside that group (a
    setsid'd child): each process is sent it once. (Sent to the group and again to each process of the cgroup, a
    shell's trap ran twice when the second came after the first was handled: the preempted job saved its work
    twice, tests/daemon/test_preemption.py.)"""
    import subprocess

    from corral.executor import _supervise

    # the job: a shell leading its own process group, with a child in that group
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    apart = subprocess.Popen(["sleep", "30"], start_new_session=True)  # a setsid'd grandchild: a group of its own
    real_killpg = os.killpg
    try:
        leaf = tmp_path / "leaf"
        (leaf / "sub").mkdir(parents=True)  # shaped like a cgroup: the job's processes listed in its files
        (leaf / "cgroup.procs").write_text(f"{leader.pid}\n{member}\n")
        (leaf / "sub" / "cgroup.procs").write_text(f"{apart.pid}\n")
        got: dict[int, int] = {}

        def killpg(pgid: int, sig: int) -> None:
            for pid in (leader.pid, member, apart.pid):
                if os.getpgid(pid) == pgid:
                    got[pid] = got.get(pid, 0) + 1

        def kill(pid: int, sig: int) -> None:
            got[pid] = got.get(pid, 0) + 1

        monkeypatch.setattr(os, "killpg", killpg)
        monkeypatch.setattr(os, "kill", kill)
        _supervise.terminate(leader.pid, str(leaf), signal.SIGTERM)
        assert got == {leader.pid: 1, member: 1, apart.pid: 1}
    finally:
        real_killpg(leader.pid, signal.SIGKILL)
        real_killpg(apart.pid, signal.SIGKILL)
        leader.wait()
        apart.wait()


@needs_cgroups
def test_what_a_job_leaves_behind_when_it_exits_is_killed(ex: LocalExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "left.pid"
    ex.launch(make_spec(tmp_path, "j", "bash", "-c", f"setsid sleep 120 & echo $! > {pidfile}; exit 3"))
    left = read_pid(pidfile)
    leaf = leaf_of(ex, "j")
    assert end_with_nothing_left(ex, "j", leaf, [left]) == Exit("j", 3, None, False)


# ------------------------------------------------------------------------------------------------ limits
@needs_memory
def test_a_job_over_its_memory_is_oom_killed_and_told(ex: LocalExecutor, tmp_path: Path) -> None:
    hog = "data = b'x' * (512 * 2**20); print('survived')"
    spec = make_spec(tmp_path, "j", sys.executable, "-c", hog, memory_mib=64)
    ex.launch(spec)
    leaf = leaf_of(ex, "j")
    ended = end_with_nothing_left(ex, "j", leaf, [])
    assert ended.oom_killed and ended.signal == signal.SIGKILL
    assert "survived" not in spec.log_path.read_text()
    ok = make_spec(tmp_path, "small", sys.executable, "-c", "data = b'x' * (8 * 2**20)", memory_mib=64)
    ex.launch(ok)
    assert end_with_nothing_left(ex, "small", leaf_of(ex, "small"), []) == Exit("small", 0, None, False)


FORK_BOMB = """
import os, time
n = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
print(n, flush=True)
time.sleep(120)
"""


@needs_pids
def test_pids_max_bounds_a_fork_bomb(tmp_path: Path) -> None:
    ex = LocalExecutor(grace_s=0.2, run_dir=tmp_path / "run", pids_max=40)
    try:
        spec = make_spec(tmp_path, "bomb", sys.executable, "-c", FORK_BOMB)
        ex.launch(spec)
        assert wait_until(lambda: spec.log_path.read_text().strip().isdigit(), 30)
        assert int(spec.log_path.read_text()) < 40  # the job's own process counts too
        leaf = leaf_of(ex, "bomb")
        pids = procs(leaf)
        ex.cancel("bomb", grace_s=0)
        end_with_nothing_left(ex, "bomb", leaf, pids)
    finally:
        ex.close()


# ------------------------------------------------------------------------------------------------ a killed supervisor
@needs_cgroups
def test_a_killed_supervisor_does_not_free_the_job_while_its_cgroup_has_processes(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    pidfile = tmp_path / "escaped.pid"
    ex.launch(make_spec(tmp_path, "j", "bash", "-c", f"setsid sleep 120 & echo $! > {pidfile}; sleep 300"))
    escaped = read_pid(pidfile)
    leaf = leaf_of(ex, "j")
    tracked = ex._jobs["j"]
    assert isinstance(tracked, _Supervised)
    os.kill(tracked.supervisor_pid, signal.SIGKILL)
    assert wait_until(lambda: not ex._supervisor_alive(tracked))
    assert ex.poll() == []  # its processes ran at that moment: no exit, the grant stays
    assert ex.ending() == {"j": ORPHANED}
    assert ex.running() == {"j"}
    ended = end_with_nothing_left(ex, "j", leaf, [escaped])
    assert ended.unknown  # its supervisor recorded nothing: the daemon says LOST
    assert ex.ending() == {}


@needs_cgroups
def test_a_restarted_daemon_holds_a_job_whose_supervisor_died_until_its_cgroup_is_empty(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = LocalExecutor(grace_s=0.3, run_dir=run_dir)
    pidfile = tmp_path / "escaped.pid"
    first.launch(make_spec(tmp_path, "j", "bash", "-c", f"setsid sleep 120 & echo $! > {pidfile}; sleep 300"))
    escaped = read_pid(pidfile)
    leaf = leaf_of(first, "j")
    tracked = first._jobs["j"]
    assert isinstance(tracked, _Supervised)
    first.close()  # the daemon stops; then its job's supervisor is killed while no daemon runs
    os.kill(tracked.supervisor_pid, signal.SIGKILL)
    second = LocalExecutor(grace_s=0.3, run_dir=run_dir)
    try:
        assert wait_until(lambda: not second._supervisor_alive(tracked))
        found = second.reattach("j", 1)
        assert found.found is Found.ALIVE  # held: not GONE while its cgroup has processes
        assert second.ending() == {"j": ORPHANED}
        assert end_with_nothing_left(second, "j", leaf, [escaped]).unknown
    finally:
        second.close()


# ------------------------------------------------------------------------------------------------ the fallback
def test_without_cgroups_jobs_fall_back_to_process_groups(tmp_path: Path) -> None:
    ex = LocalExecutor(
        grace_s=0.2, run_dir=tmp_path / "run", cgroups=NoCgroups("cannot create /cg/x: Permission denied")
    )
    try:
        assert not ex.contained
        assert ex.containment == "no cgroups: falling back to process groups (cannot create /cg/x: Permission denied)"
        pidfile = tmp_path / "child.pid"
        ex.launch(make_spec(tmp_path, "j", "sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"))
        child = read_pid(pidfile)
        ex.cancel("j", grace_s=0)
        assert wait_until(lambda: bool(ex.poll()))
        assert wait_until(lambda: gone(child))  # the process group still works
    finally:
        ex.close()


def test_no_cgroup_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert prepare(tmp_path, mountinfo="22 1 0:20 / /proc rw - proc proc rw\n") == NoCgroups(
        "no cgroup v2 hierarchy is mounted"
    )
    assert prepare(tmp_path, mount=tmp_path, proc_cgroup="1:cpu:/\n").notice == (
        "no cgroups: falling back to process groups "
        "(this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup))"
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "cgroup.procs").write_text("")

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", denied)
    refused = prepare(tmp_path / "state" / "run", mount=tree, proc_cgroup="0::/\n")
    assert isinstance(refused, NoCgroups)
    assert refused.reason.startswith(f"cannot create {tree}/corral-")
    assert refused.reason.endswith(": Permission denied; run the daemon as root, or under systemd with Delegate=yes")


def test_the_v2_mount_and_own_cgroup_come_from_proc_never_assumed() -> None:
    hybrid = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert find_v2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert find_v2_mount("29 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n") == Path(
        "/sys/fs/cgroup"
    )
    assert find_v2_mount("1 2 0:1 / /odd\\040place rw - cgroup2 none rw\n") == Path("/odd place")
    assert own_cgroup("4:memory:/x\n0::/system.slice/corral.service\n") == "/system.slice/corral.service"
    assert own_cgroup("0::/\n") == "/"


def test_v2_limits_are_written_where_the_controllers_are(tmp_path: Path) -> None:
    """No v2 controllers on the development machine (hybrid layout): the writes, against a cgroup-shaped folder."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name, text in {"cgroup.procs": "1\n", "cgroup.controllers": "cpu io memory pids\n"}.items():
        (tree / name).write_text(text)
    (tree / "cgroup.subtree_control").write_text("")
    run = tmp_path / "run"
    # a real kernel fills a new cgroup's files (its controllers: the parent's subtree_control); here, by hand
    made = tree / f"corral-{hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:12]}"
    made.mkdir()
    for name, text in {
        "cgroup.controllers": "cpu memory pids\n",
        "cgroup.kill": "",
        "cgroup.events": "populated 0\n",
    }.items():
        (made / name).write_text(text)
    sub = prepare(run, mount=tree, proc_cgroup="0::/\n")
    assert isinstance(sub, Subtree) and sub.path == made and sub.controllers == {"cpu", "memory", "pids"}
    assert (tree / "cgroup.subtree_control").read_text() == "+pids"  # each written in turn: +cpu, +memory, +pids
    assert (made / "cgroup.subtree_control").read_text() == "+pids"
    assert sub.notice == f"jobs contained in cgroup v2 leaves under {sub.path}; limits: cpu, memory, pids"
    leaf = sub.make_leaf("7_1", 2, Limits(cpu_milli=1500, memory_mib=2048, pids_max=4096))
    assert leaf == sub.path / "job-7_1.2"
    assert (leaf / "cpu.max").read_text() == "150000 100000"  # 1.5 CPUs
    assert (leaf / "memory.max").read_text() == str(2048 * 1024 * 1024)
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "pids.max").read_text() == "4096"
    assert sub.limit_files(Limits(0, 0, None)) == {}  # no request, no limit
    none = Subtree(sub.path, frozenset(), delegated=False)
    assert none.limit_files(Limits(1000, 1024, 100)) == {}  # no controller, nothing written


def test_under_systemd_with_delegate_the_service_cgroup_is_used_and_the_daemon_moves_into_a_leaf(
    tmp_path: Path,
) -> None:
    """Delegate=yes, against a cgroup-shaped folder: systemd marks the service's cgroup trusted.delegate=1."""
    tree = tmp_path / "tree"
    service = tree / "system.slice" / "corral.service"
    service.mkdir(parents=True)
    (service / "cgroup.procs").write_text("4242\n")
    (service / "cgroup.controllers").write_text("cpu memory pids\n")
    try:
        os.setxattr(service, "trusted.delegate", b"1")
    except OSError as exc:
        pytest.skip(f"trusted xattrs need root and a filesystem that keeps them: {exc}")
    sub = prepare(tmp_path / "run", mount=tree, proc_cgroup="0::/system.slice/corral.service\n")
    assert isinstance(sub, Subtree) and sub.delegated and sub.path == service
    assert (service / "daemon" / "cgroup.procs").read_text() == "4242"  # the daemon left the service's own cgroup
    assert sub.controllers == {"cpu", "memory", "pids"}
    assert sub.leaf("3", 1) == service / "job-3.1"
    sub.close()
    assert service.is_dir()  # the service's cgroup is never removed


@needs_cgroups
def test_a_subtree_removed_under_the_daemon_is_made_again_for_the_next_leaf(tmp_path: Path) -> None:
    """Something removes the daemon's empty subtree (an admin's cleanup of empty cgroups, a test run's tidy-up): the
    next job's leaf is still made, under the subtree made again, instead of the launch failing with ENOENT."""
    sub = prepare(tmp_path / "run")
    assert isinstance(sub, Subtree)
    try:
        for _, base in sub.v1:
            base.rmdir()
        sub.path.rmdir()
        leaf = sub.make_leaf("9", 1, Limits(memory_mib=64, pids_max=32))
        assert leaf.parent == sub.path and (leaf / "cgroup.procs").exists()
        assert all((base / leaf.name).is_dir() for _, base in sub.v1)
        assert sub.remove_leaf(leaf)
    finally:
        sub.close()
    assert not sub.path.exists()
