"""A batch script end to end on a shared machine (issue 26 item 4): a real user submits an #SBATCH script to a root
`corral serve`; the job runs as that user and writes its --output as that user; another user's planted symbolic
link is refused at submission, naming it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.realusers import CLI, NEEDS_ROOT, as_user, can_run, local_users, root_daemon, user_env, wait_for


@pytest.fixture
def open_dirs() -> Iterator[tuple[Path, Path, Path]]:
    """(state, runtime, shared): the daemon's state, a runtime folder all may traverse, a sticky /tmp-like folder."""
    made = [Path(tempfile.mkdtemp(prefix=f"corral-batch-{what}-")) for what in ("state", "run", "shared")]
    made[1].chmod(0o755)
    made[2].chmod(0o1777)
    try:
        yield made[0], made[1], made[2]
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not can_run(), reason=NEEDS_ROOT)
def test_a_users_script_runs_as_them_and_a_planted_link_is_refused(open_dirs: tuple[Path, Path, Path]) -> None:
    state, runtime, shared = open_dirs
    sock = runtime / "corral.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with (
        local_users(("a", None), ("b", None)) as users,
        root_daemon(state, ["--runtime-dir", str(runtime)], sock, env),
    ):
        a, mallory = users["a"], users["b"]
        script = Path(a.home) / "job.sh"
        script.write_text(f'#!/bin/sh\n#SBATCH -J mine -o {a.home}/out-%x-%j.txt\nid -un\necho "$SLURM_JOB_NAME"\n')
        os.chown(script, a.uid, a.gid)
        as_user(mallory, ["ln", "-s", a.home, str(shared / "dir")])
        user = user_env(CORRAL_SOCKET=str(sock))

        done = as_user(a, [*CLI, "submit", str(script)], env=user)
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip()

        def ended() -> bool:
            shown = as_user(a, [*CLI, "show", job, "--json"], env=user)
            return json.loads(shown.stdout)["state"] in ("succeeded", "failed")

        wait_for("a's batch job", ended, timeout=60)
        out = Path(a.home) / f"out-mine-{job}.txt"
        assert out.read_text() == f"{a.name}\nmine\n"
        assert (out.stat().st_uid, out.stat().st_mode & 0o777) == (a.uid, 0o600)

        planted = as_user(a, [*CLI, "submit", "-o", f"{shared}/dir/x-%j", str(script)], env=user)
        assert planted.returncode == 2
        assert planted.stderr == (
            f"error: --output: {shared}/dir/x-%j: {shared}/dir is a symbolic link of uid {mallory.uid}, not of the "
            "job's user: corral does not write through another user's link\n"
        )
