"""Batch scripts over the API (issue 26 item 4): `script` and `output` / `error` on POST /v1/jobs, their bounds, the
stored text (GET /v1/jobs/ID/script, the spec's JSON), the launch's fields, and an --output refused at submission
when it is already out of the user's reach (corral.executor.outputs)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.jobs.batch import MAX_SCRIPT_BYTES, Script
from corral.jobs.model import spec_from_json, spec_to_json
from tests.api.test_api import ALICE, BOB, World, submit

TEXT = "#!/bin/bash\n#SBATCH --gres=gpu:1\necho hi\n"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def here() -> Iterator[Path]:
    """A folder every user may traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="corral-batch-api-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def post(world: World, who: tuple[int, int, str] = ALICE, **body: Any) -> Any:
    return world.client(who).post("/v1/jobs", json={"command": ["job.sh", "x"], **body})


def test_a_script_is_stored_with_its_job_and_launched_from_its_text(world: World, here: Path) -> None:
    tmp_path = here
    os.chown(here, 1000, 1000)
    job = submit(world.client(ALICE), command=["job.sh", "x"], script={"text": TEXT, "dialect": "sbatch"},
                 output="out-%j-%x.txt", name="n", cwd=str(tmp_path))  # fmt: skip
    assert job["script"] == {"name": "job.sh", "dialect": "sbatch", "args": ["x"], "bytes": len(TEXT)}
    assert (job["output"], job["error"], job["command"]) == ("out-%j-%x.txt", "", ["job.sh", "x"])
    answer = world.client(ALICE).get(f"/v1/jobs/{job['id']}/script")
    assert answer.status_code == 200 and answer.text == TEXT
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert world.client(BOB).get(f"/v1/jobs/{job['id']}/script").status_code == 404  # another user's
    listed = world.client(ALICE).get("/v1/jobs").json()
    assert listed[0]["script"] == job["script"] and listed[0]["output"] == "out-%j-%x.txt"
    one = world.client(ALICE).get(f"/v1/jobs/{job['id']}").json()
    assert listed[0] == {**one, "log_path": None}  # the listing's rows (job_row) are JobOut's, script and all
    stored = world.daemon.store.get(job["id"])
    assert stored is not None and stored.spec.script == Script(TEXT, "sbatch", "job.sh", ("x",))
    assert spec_from_json(spec_to_json(stored.spec)) == stored.spec
    world.tick()
    [launched] = world.executor.launched
    assert launched.script == TEXT and launched.command == ("job.sh", "x")
    assert launched.output == f"{tmp_path}/out-{job['id']}-n.txt" and launched.error is None
    slurm = {k: v for k, v in launched.corral_env.items() if k.startswith("SLURM_")}
    assert slurm == {"SLURM_JOB_ID": job["id"], "SLURM_JOBID": job["id"], "SLURM_JOB_NAME": "n",
                     "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_USER": "alice"}  # fmt: skip
    logs = world.client(ALICE).get(f"/v1/jobs/{job['id']}/logs")
    assert logs.headers["X-Corral-Redirected"] == "stdout,stderr"
    err_only = submit(world.client(ALICE), command=["true"], error="e-%j", cwd=str(tmp_path))
    assert world.client(ALICE).get(f"/v1/jobs/{err_only['id']}/logs").headers["X-Corral-Redirected"] == "stderr"
    plain = submit(world.client(ALICE), command=["true"])
    assert "X-Corral-Redirected" not in world.client(ALICE).get(f"/v1/jobs/{plain['id']}/logs").headers
    assert plain["script"] is None and plain["output"] == ""
    missing = world.client(ALICE).get(f"/v1/jobs/{plain['id']}/script")
    assert missing.status_code == 404
    assert missing.json()["detail"] == {
        "field": "script",
        "message": f"job {plain['id']} is no batch script: it runs 'true' as it is",
    }


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"script": {"text": "#!/bin/sh\n" + "é" * (MAX_SCRIPT_BYTES // 2)}}, "script.text",
         f"must be at most {MAX_SCRIPT_BYTES} bytes, got {MAX_SCRIPT_BYTES + 10}"),
        ({"script": {"text": "echo hi\n"}}, "script.text",
         "a batch script starts with #! and its interpreter, e.g. #!/bin/bash"),
        ({"script": {"text": "x" * (MAX_SCRIPT_BYTES + 1)}}, "script.text",
         f"String should have at most {MAX_SCRIPT_BYTES} characters"),
        ({"script": {"text": TEXT, "dialect": "pbs"}}, "script.dialect", "Input should be 'corral' or 'sbatch'"),
        ({"output": "o-%y"}, "output", "%y is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ({"error": "logs/"}, "error", "names a directory; give a file name in it (e.g. out/%j.log)"),
        ({"output": "o", "instances": 2, "gang": True}, "output",
         "a gang's instances each write their own log; --output and --error take a job of one process"),
    ],
)  # fmt: skip
def test_bad_scripts_and_patterns_get_a_422_naming_the_field(
    world: World, body: dict[str, Any], field: str, message: str
) -> None:
    answer = post(world, **body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert (detail["field"], detail["message"]) == (field, message)


def test_an_output_out_of_reach_at_submission_is_refused(world: World, here: Path) -> None:
    """ALICE is uid 1000 here: what the daemon knows of the path at submission is weighed for that uid."""
    tmp_path = here
    shared = tmp_path / "shared"
    shared.mkdir()
    tmp_path.chmod(0o755)
    shared.chmod(0o1777)
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, 1000, 1000)
    planted = shared / "dir"
    planted.symlink_to(mine)
    os.lchown(planted, 4242, 4242)
    (shared / "out.txt").symlink_to(mine / "x")
    os.lchown(shared / "out.txt", 1000, 1000)
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    cases = {
        f"{planted}/o-%j": f"{planted}/o-%j: {planted} is a symbolic link of uid 4242, not of the job's user: corral "
        "does not write through another user's link",
        f"{shared}/out.txt": f"{shared}/out.txt: is a symbolic link; corral opens output files only without "
        "following one (O_NOFOLLOW)",
        f"{roots}/o-%j": f"{roots}/o-%j: the job's user cannot write in its directory",
        "../roots/o": f"{mine}/../roots/o: the job's user cannot write in its directory",
        f"{tmp_path}/fifo": f"{tmp_path}/fifo: is not a regular file",
    }
    os.mkfifo(tmp_path / "fifo")
    for pattern, message in cases.items():
        answer = post(world, output=pattern, cwd=str(mine))
        assert answer.status_code == 422, pattern
        assert answer.json()["detail"] == {"field": "output", "message": message}
    # what is fine, or cannot be known before the launch: accepted
    for pattern in ("o-%j", f"{mine}/new/o", "%u/o", "/dev/null", f"{shared}/o-%j"):
        assert post(world, output=pattern, cwd=str(mine)).status_code == 201, pattern
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "link").symlink_to("/etc/passwd")
    answer = post(world, output=f"{hidden}/link", cwd=str(mine))  # what is in it is not told: only that it is closed
    assert answer.json()["detail"]["message"] == f"{hidden}/link: the job's user may not enter {hidden}"
    answer = post(world, error=f"{hidden}/sub/e", cwd=str(mine))
    assert answer.json()["detail"] == {"field": "error", "message": f"{hidden}/sub/e: the job's user may not enter "
                                                                     f"{hidden}"}  # fmt: skip


def test_an_sbatch_array_gets_its_task_ids_in_output_names_and_slurms_variables(world: World, here: Path) -> None:
    os.chown(here, 1000, 1000)
    head = submit(world.client(ALICE), command=["job.sh"], script={"text": TEXT, "dialect": "sbatch"},
                  array="3-5", output="o-%A_%a-%j.txt", cwd=str(here), gpus=0)  # fmt: skip
    world.tick()
    launched = sorted(world.executor.launched, key=lambda s: int(s.job_id))
    first = int(head["id"])
    assert [s.output for s in launched] == [f"{here}/o-{head['id']}_{task}-{first + k}.txt"
                                            for k, task in enumerate((3, 4, 5))]  # fmt: skip
    assert [s.corral_env["SLURM_ARRAY_TASK_ID"] for s in launched] == ["3", "4", "5"]
    assert {s.corral_env["SLURM_ARRAY_JOB_ID"] for s in launched} == {head["id"]}
    assert [s.corral_env["SLURM_JOB_ID"] for s in launched] == [str(first + k) for k in range(3)]
    assert all(s.script == TEXT for s in launched)
