"""`corral submit script.sh [args]` (issue 26 item 4): directives merged with the command line in-process, then one
real `corral serve` that runs a script, its retry from the stored text after the file changed, --output patterns,
the one warning and the errors that name a directive's line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from corral.cli.client import submit_cmd
from corral.cli.scripts import Submission, directive_error, submission
from corral.jobs.batch import ScriptError
from tests.api.test_serve import CLI, Corral, serving, wait_for

HAS_ARRAYS = any(p.name == "array" for p in submit_cmd.params)


def submit_of(tmp_path: Path, text: str, *cli: str) -> Submission:
    """What `corral submit CLI... job.sh` would submit, with job.sh holding `text`."""
    path = tmp_path / "job.sh"
    path.write_text(text)
    ctx = submit_cmd.make_context("submit", [*cli, str(path), "arg1"])
    found = submission(ctx, tuple(ctx.params["command"]))
    assert found is not None
    return found


def test_the_command_line_wins_over_directives_and_a_later_directive_over_an_earlier(tmp_path: Path) -> None:
    text = (
        "#!/bin/sh\n#SBATCH --gres=gpu:a100:1 -J first -t 10\n#CORRAL --name second --retries 2 --gpu-model H100\n"
        "#CORRAL --no-preempt --cpus 2 --gpu-model L4\n#SBATCH -c 4\ntrue\n"
    )
    got = submit_of(tmp_path, text).params
    assert (got["gres"], got["gpus"], got["name"], got["time_limit"]) == ("gpu:a100:1", None, "second", "10")
    assert (got["retries"], got["no_preempt"], got["cpus"], got["gpu_model"]) == (2, True, "4", ("H100", "L4"))
    cli = submit_of(tmp_path, text, "--gpus", "2", "--name", "cli", "--cpus", "1", "--gpu-model", "A100").params
    # the command line's --gpus decides the GPUs in either spelling; its --gpu-model replaces the directives'
    assert (cli["gres"], cli["gpus"], cli["name"], cli["cpus"], cli["gpu_model"]) == (None, "2", "cli", "1", ("A100",))
    assert cli["retries"] == 2 and cli["time_limit"] == "10"
    script = submit_of(tmp_path, text).script
    assert (script.dialect, script.name, script.args, script.text) == ("sbatch", str(tmp_path / "job.sh"), ("arg1",),
                                                                       text)  # fmt: skip
    corral_only = submit_of(tmp_path, "#!/bin/sh\n#CORRAL --gpus 1 --output o-%j\ntrue\n")
    assert corral_only.script.dialect == "corral" and corral_only.params["output"] == "o-%j"
    assert corral_only.warning is None
    assert corral_only.params["name"] == "job.sh"  # as sbatch: the script's file name, unless a name is given


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#CORRAL --bogus", "No such option '--bogus'. (Did you mean one of: '--cpus', '--gpus', '--gres'?)"),
        ("#CORRAL --priority high", "Invalid value for '--priority': 'high' is not a valid integer."),
        (
            "#CORRAL --gpus 0.5",
            "--gpus: a whole number of GPUs, got '0.5'; for a share of one GPU use --gpu-fraction 0.5",
        ),
        ("#CORRAL --gres gpu", "--gres: give gpu:N or gpu:MODEL:N, got 'gpu'"),
        ("#CORRAL --output a%z", "--output: %z is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ("#CORRAL --gpus 1 -- python train.py", "#CORRAL lines take submit's options only, not a command"),
        ("#CORRAL --help", "--help is no directive"),
    ],
)
def test_a_bad_corral_directive_names_its_line(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ScriptError) as exc:
        submit_of(tmp_path, f"#!/bin/sh\n{line}\ntrue\n")
    assert str(exc.value) == f"{tmp_path / 'job.sh'} line 2 ({line}): {message}"


@pytest.mark.skipif(HAS_ARRAYS, reason="job arrays are here: the next test gives them #SBATCH --array")
def test_sbatch_array_without_job_arrays_is_refused_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(ScriptError) as exc:
        submit_of(tmp_path, "#!/bin/sh\n#SBATCH --array=0-3\ntrue\n")
    assert str(exc.value) == (
        f"{tmp_path / 'job.sh'} line 2 (#SBATCH --array=0-3): this corral has no --array to give it to"
    )


@pytest.mark.skipif(not HAS_ARRAYS, reason="to be enabled when branch arrays (submit --array) is merged")
def test_sbatch_array_is_submits_array(tmp_path: Path) -> None:
    got = submit_of(tmp_path, "#!/bin/sh\n#SBATCH --array=0-3%2\ntrue\n")
    assert got.params["array"] == "0-3%2"
    assert submit_of(tmp_path, "#!/bin/sh\n#SBATCH -a 1,3\ntrue\n", "--array", "5-6").params["array"] == "5-6"


def test_a_daemon_error_on_a_field_a_directive_gave_names_that_directive(tmp_path: Path) -> None:
    got = submit_of(tmp_path, "#!/bin/sh\n#SBATCH -t soon\n#SBATCH --gres=gpu:2\ntrue\n", "--memory", "x")
    name = str(tmp_path / "job.sh")
    said = directive_error("time_limit", "--time-limit: not a duration", got.origins, name)
    assert said == f"{name} line 2 (#SBATCH -t soon): --time-limit: not a duration"
    assert directive_error("gpus", "--gpus: too many", got.origins, name) == (
        f"{name} line 3 (#SBATCH --gres=gpu:2): --gpus: too many"
    )
    assert directive_error("memory", "--memory: bad", got.origins, name) is None  # the command line's own


def test_an_ordinary_file_is_run_as_a_command(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text("#!/bin/sh\necho hi\n")
    ctx = submit_cmd.make_context("submit", [str(path)])
    assert submission(ctx, (str(path),)) is None
    assert isinstance(ctx, click.Context)


# ------------------------------------------------------------------------------------------------ live
SCRIPT = """#!/bin/sh
#SBATCH --job-name=stored -t 5 --nodes=1
#SBATCH --output=out-%x-%j.txt --exclusive
#CORRAL --retries 1
if [ -e marker ]; then echo "second run of the stored text, args: $*"; exit 0; fi
touch marker
printf '#!/bin/sh\\n#SBATCH -t 5\\necho CHANGED\\n' > job.sh
echo "first run, args: $*"
echo "to stderr" >&2
exit 3
"""


def ended(corral: Corral, job: str) -> str:
    """The job's final state, once it has one (with its reason, to say why when it is not the one expected). A
    failure with a retry left is not final: the daemon stores FAILED, then the job's return to the queue, and a
    look between the two writes (a loaded machine) sees "failed"."""

    def final() -> bool:
        found = corral.jobs()[job]
        if found["state"] == "failed":
            return bool(found["attempts"] > found["request"]["retries"])
        return found["state"] in ("succeeded", "cancelled")

    wait_for(f"job {job} to end", final, timeout=60)
    found = corral.jobs()[job]
    return str(found["state"]) if found["state"] == "succeeded" else f"{found['state']}: {found['reason']}"


def run(sock: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_SOCKET": str(sock), "COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=20)


def test_a_script_runs_its_stored_text_on_retry_writes_its_output_and_says_what_it_ignored(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.sh").write_text(SCRIPT)
    with serving(tmp_path / "corral.sock", tmp_path / "state") as (corral, _):
        sock = tmp_path / "corral.sock"
        # A job that runs throughout keeps the daemon's cgroup subtree non-empty: another pytest session on this
        # machine that ends meanwhile removes the empty corral-* subtrees made during it (tests/conftest.py).
        keeper = corral.submit("--cpus", "100m", "--memory", "16MiB", "--", "sleep", "600")
        done = run(sock, work, "submit", "job.sh", "a b", "c")
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip()
        assert done.stderr == (
            "warning: job.sh: #SBATCH directives corral does not honour, ignored: --nodes=1 (line 2), --exclusive "
            "(line 3)\n"
        )
        assert ended(corral, job) == "succeeded"
        # the first attempt rewrote job.sh; the retry ran the text stored at submission, from its own copy
        assert (work / "job.sh").read_text().endswith("echo CHANGED\n")
        assert (work / f"out-stored-{job}.txt").read_text() == (
            "first run, args: a b c\nto stderr\nsecond run of the stored text, args: a b c\n"
        )
        shown: dict[str, Any] = json.loads(run(sock, work, "show", job, "--json").stdout)
        assert shown["attempts"] == 2 and shown["output"] == "out-%x-%j.txt" and shown["error"] == ""
        assert shown["script"] == {"name": "job.sh", "dialect": "sbatch", "args": ["a b", "c"], "bytes": len(SCRIPT)}
        assert shown["command"] == ["job.sh", "a b", "c"]
        assert run(sock, work, "show", "--script", job).stdout == SCRIPT
        lines = run(sock, work, "show", job).stdout
        assert (
            f"     script: job.sh (sbatch directives; {len(SCRIPT)} bytes stored: corral show --script {job})" in lines
        )
        assert "     output: out-%x-%j.txt" in lines
        plain = corral.submit("--", "true")
        assert run(sock, work, "show", "--script", plain).stderr == (
            f"error: script: job {plain} is no batch script: it runs 'true' as it is\n"
        )

        # a value only the daemon checks: its error names the directive's line
        (work / "bad.sh").write_text("#!/bin/sh\n#SBATCH --time=soon\ntrue\n")
        bad = run(sock, work, "submit", "bad.sh")
        assert bad.returncode == 2
        assert bad.stderr.startswith("error: bad.sh line 2 (#SBATCH --time=soon): --time-limit: ")
        # one the client checks
        (work / "bad.sh").write_text("#!/bin/sh\n#SBATCH --mem=lots\ntrue\n")
        assert run(sock, work, "submit", "bad.sh").stderr == (
            "error: bad.sh line 2 (#SBATCH --mem=lots): --mem: give an amount as Slurm does (16G, 512M, 1T; a bare "
            "number is MB), got 'lots'\n"
        )
        # --output on the command line, without a script; --error apart
        apart = run(sock, work, "submit", "-o", "p-%j.out", "-e", "p-%j.err", "--", "sh", "-c", "echo o; echo e >&2")
        assert ended(corral, apart.stdout.strip()) == "succeeded"
        assert (work / f"p-{apart.stdout.strip()}.out").read_text() == "o\n"
        assert (work / f"p-{apart.stdout.strip()}.err").read_text() == "e\n"
        logs = run(sock, work, "logs", apart.stdout.strip())
        assert (logs.stdout, logs.stderr) == ("", (
            f"note: job {apart.stdout.strip()} writes its stdout and stderr to the file of its --output/--error, not "
            f"to this log (corral show {apart.stdout.strip()} names it)\n"
        ))  # fmt: skip
        # a folder missing at submission may be made before the start; still missing then, the job fails naming it
        late = run(sock, work, "submit", "-o", "missing/o-%j", "--", "true").stdout.strip()
        assert ended(corral, late) == (
            f"failed: could not start: [Errno 2] job {late}: --output {work}/missing/o-{late}: {work}/missing: No such "
            "file or directory"
        )
        bad_pattern = run(sock, work, "submit", "-o", "x-%q", "--", "true")
        assert bad_pattern.stderr == (
            "error: --output: %q is no pattern corral knows: %j %A %a %u %x, and %% for a % sign\n"
        )
        if HAS_ARRAYS:  # an #SBATCH array: each task's file named by %A and %a, Slurm's variables set
            (work / "arr.sh").write_text(
                "#!/bin/sh\n#SBATCH --array=0-1 -o arr-%A_%a.out\necho $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID\n"
            )
            head = run(sock, work, "submit", "arr.sh").stdout.strip()

            def tasks_ended() -> bool:
                shown = json.loads(run(sock, work, "show", f"{head}_[0-1]", "--json").stdout)
                return [t["state"] for t in shown] == ["succeeded", "succeeded"]

            wait_for("the array's tasks", tasks_ended, timeout=60)
            assert [(work / f"arr-{head}_{t}.out").read_text() for t in (0, 1)] == [f"{head} 0\n", f"{head} 1\n"]
        corral.run("cancel", keeper)


def test_submitting_a_script_loads_nothing_heavy(tmp_path: Path) -> None:
    """`corral submit job.sh` with no daemon there: reads the script and its directives, then one error line."""
    from tests.cli.test_startup import heavy, loaded_after

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -t 5 --nodes=1\n#CORRAL --gpus 1\ntrue\n")
    modules = loaded_after(
        "from corral.cli.main import app\napp(prog_name='corral')",
        "submit",
        str(script),
        env={"CORRAL_SOCKET": str(tmp_path / "x")},
    )
    assert "corral.cli.scripts" in modules and "corral.jobs.batch" in modules
    assert heavy(modules) == [] and "typer" not in modules
