"""Batch scripts, the pure part (corral.jobs.batch): which files are batch scripts, what makes one unusable, how
#SBATCH directives become corral's options, and the --output / --error patterns."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.jobs.batch import (
    MAX_SCRIPT_BYTES,
    Script,
    ScriptError,
    admission_problems,
    dialect_of,
    directives,
    expand,
    has_pattern,
    launch_path,
    pattern_problem,
    read_script,
    sbatch_settings,
    warning,
)

SBATCH = """#!/bin/bash
#SBATCH --job-name=train -t 1:30:00
# an ordinary comment
#SBATCH --gres=gpu:a100:2,shard:1
##SBATCH --gpus=8   (disabled: two #)

#SBATCH -c 8 --mem=16G
#SBATCH --nodes=1 --ntasks 4 --exclusive
#SBATCH -o logs/%x-%j.out --error=err#1.txt  # a comment after the options
#SBATCH -p short -d afterok:3 --array=0-9%2
#CORRAL --priority 5
echo start
#SBATCH --time=5   (after the first command: sbatch ignores it, so does corral)
"""


def write(tmp_path: Path, text: str | bytes, name: str = "job.sh") -> str:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def test_a_file_is_a_batch_script_only_with_a_directive_in_its_leading_comment_block(tmp_path: Path) -> None:
    assert read_script(write(tmp_path, SBATCH)) == SBATCH
    assert read_script(write(tmp_path, "#!/bin/sh\n#CORRAL --gpus 1\ntrue\n")) is not None
    # an ordinary script, a directive after the first command, a binary, a directory, a missing file: commands
    assert read_script(write(tmp_path, "#!/bin/sh\necho hi\n")) is None
    assert read_script(write(tmp_path, "#!/bin/sh\necho hi\n#SBATCH --gpus=1\n")) is None
    assert read_script(write(tmp_path, b"\x7fELF\x02\x01\x01\0\0#SBATCH\n")) is None
    assert read_script(str(tmp_path)) is None
    assert read_script(str(tmp_path / "missing")) is None
    assert read_script(write(tmp_path, "#!/bin/sh\n#SBATCHX --gpus=1\n# SBATCH -t 5\ntrue\n")) is None


def test_a_script_too_large_binary_or_not_utf8_is_refused_naming_the_line(tmp_path: Path) -> None:
    big = "#!/bin/sh\n#SBATCH -t 5\n" + "echo " + "x" * 100 + "\n"
    huge = tmp_path / "huge.sh"
    with huge.open("w") as f:  # 100 MB: only the first 256 KiB + 1 byte is ever read
        f.write(big)
        f.seek(100 * 1024 * 1024)
        f.write("\n")
    with pytest.raises(ScriptError) as exc:
        read_script(str(huge))
    assert str(exc.value) == (
        f"{huge}: a batch script of 104,857,601 bytes; the most is {MAX_SCRIPT_BYTES:,} bytes (256 KiB): keep data "
        "out of the script and read it from a file"
    )
    path = write(tmp_path, b"#!/bin/sh\n#SBATCH -t 5\necho a\n\0\0binary")
    with pytest.raises(ScriptError) as exc:
        read_script(path)
    assert str(exc.value) == f"{path} line 4: a NUL byte (binary data at byte 30): a batch script is text"
    path = write(tmp_path, b"#!/bin/sh\n#SBATCH -t 5\necho caf\xe9\n")
    with pytest.raises(ScriptError) as exc:
        read_script(path)
    assert str(exc.value) == f"{path} line 3: not UTF-8 text (byte 31): save the script as UTF-8"
    path = write(tmp_path, b"#!/bin/sh\r\n#SBATCH -t 5\r\ntrue\r\n")
    with pytest.raises(ScriptError) as exc:
        read_script(path)
    assert (
        str(exc.value) == f"{path} line 1: a DOS line break (\\r\\n): save the script with Unix line breaks (dos2unix)"
    )
    path = write(tmp_path, "#SBATCH -t 5\ntrue\n")
    with pytest.raises(ScriptError) as exc:
        read_script(path)
    assert str(exc.value) == f"{path} line 1: a batch script starts with #! and its interpreter, e.g. #!/bin/bash"


def test_directives_are_read_as_sbatch_reads_them() -> None:
    found = directives(SBATCH, "job.sh")
    assert [(d.line, d.dialect) for d in found] == [
        (2, "sbatch"), (4, "sbatch"), (7, "sbatch"), (8, "sbatch"), (9, "sbatch"), (10, "sbatch"), (11, "corral"),
    ]  # fmt: skip
    assert found[4].words == ("-o", "logs/%x-%j.out", "--error=err#1.txt")  # a '#' inside a word stays
    assert dialect_of(found) == "sbatch"
    assert dialect_of(directives("#!/bin/sh\n#CORRAL --gpus 1\n", "x")) == "corral"
    with pytest.raises(ScriptError) as exc:
        directives('#!/bin/sh\n#SBATCH -J "unclosed\n', "job.sh")
    assert str(exc.value) == 'job.sh line 2 (#SBATCH -J "unclosed): No closing quotation'


def test_an_ignored_short_option_is_named_as_written() -> None:
    _, ignored = sbatch_settings(directives("#!/bin/sh\n#SBATCH -N 2 -A lab\n", "j.sh"), "j.sh")
    assert ignored == ["-N 2 (line 2)", "-A lab (line 2)"]


def test_sbatch_directives_become_corral_options_and_the_rest_one_warning() -> None:
    settings, ignored = sbatch_settings(directives(SBATCH, "job.sh"), "job.sh")
    assert [(s.param, s.value, s.directive.line) for s in settings] == [
        ("name", "train", 2),
        ("time_limit", "1:30:00", 2),
        ("gres", "gpu:a100:2", 4),
        ("cpus", "8", 7),
        ("memory", "16GiB", 7),
        ("output", "logs/%x-%j.out", 9),
        ("error", "err#1.txt", 9),
        ("queue", "short", 10),
        ("dependency", "afterok:3", 10),
        ("array", "0-9%2", 10),
    ]
    assert ignored == ["--gres=shard:1 (line 4)", "--nodes=1 (line 8)", "--ntasks=4 (line 8)", "--exclusive (line 8)"]
    assert warning("job.sh", ignored) == (
        "job.sh: #SBATCH directives corral does not honour, ignored: --gres=shard:1 (line 4), --nodes=1 (line 8), "
        "--ntasks=4 (line 8), --exclusive (line 8)"
    )


@pytest.mark.parametrize(
    ("line", "param", "value"),
    [
        ("--gres=gpu", "gres", "gpu:1"),
        ("--gres=gpu:4", "gres", "gpu:4"),
        ("--gpus=2", "gpus", "2"),
        ("-G 3", "gpus", "3"),
        ("--gpus=h100:2", "gres", "gpu:h100:2"),
        ("--gpus-per-node=2", "gpus", "2"),
        ("--mem=500", "memory", "500MiB"),
        ("--mem=2T", "memory", "2TiB"),
        ("--mem=64gb", "memory", "64GiB"),
        ("-t10", "time_limit", "10"),
        ("--time=UNLIMITED", "time_limit", None),
        ("-Jname", "name", "name"),
        ("--partition=gpu", "queue", "gpu"),
        ("-a 1,3,5-7", "array", "1,3,5-7"),
    ],
)
def test_each_spelling_of_an_honoured_sbatch_option(line: str, param: str, value: str | None) -> None:
    settings, ignored = sbatch_settings(directives(f"#!/bin/sh\n#SBATCH {line}\n", "j.sh"), "j.sh")
    assert [(s.param, s.value) for s in settings] == [(param, value)] and ignored == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--gres=gpu:x", "--gres: give gpu:N or gpu:MODEL:N, got 'gpu:x'"),
        ("--gpus=0.5", "--gpus: give a whole number of GPUs, N or TYPE:N, got '0.5'"),
        ("-c 0", "-c: give a whole number of CPUs (1 or more), got '0'"),
        ("--mem=lots", "--mem: give an amount as Slurm does (16G, 512M, 1T; a bare number is MB), got 'lots'"),
        ("--mem=0", "--mem=0 asks Slurm for all of a node's memory; give an amount, e.g. --mem=16G"),
        ("--partition=a,b", "--partition: corral runs a job in one queue, got 'a,b'"),
        ("--output=out-%N.txt", "--output: %N is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ("--time", "--time needs a value"),
        ("train.py", "'train.py' is not an option"),
    ],
)
def test_a_bad_sbatch_value_names_the_line_and_the_directive(line: str, message: str) -> None:
    with pytest.raises(ScriptError) as exc:
        sbatch_settings(directives(f"#!/bin/sh\n\n#SBATCH {line}\n", "j.sh"), "j.sh")
    assert str(exc.value) == f"j.sh line 3 (#SBATCH {line}): {message}"


def test_output_patterns_expand_as_sbatch_does() -> None:
    kw = {"job": "42", "user": "alice", "name": "train"}
    assert expand("out/%x-%j.%u.log", **kw) == "out/train-42.alice.log"
    assert expand("%A_%a.out", **kw) == "42_.out"  # outside an array: %A is the job, %a empty
    assert expand("%A_%3a.out", **kw, array_job="40", task="7") == "40_007.out"
    assert expand("100%%-%5j", **kw) == "100%-00042"
    assert launch_path("o-%j", job="7", user="u", name="", cwd="/home/u/") == "/home/u/o-7"
    assert launch_path("/tmp/o-%j", job="7", user="u", name="", cwd="/home/u") == "/tmp/o-7"
    assert has_pattern("a/%j/b") and not has_pattern("100%%/b")


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "give a file name (patterns: %j %A %a %u %x, %% for a %)"),
        ("a%", "a % at the end is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ("a%s", "%s is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ("a%2%", "%2% is no pattern: %% is a % sign"),
        ("logs/", "names a directory; give a file name in it (e.g. out/%j.log)"),
        ("a\0b", "must not contain a NUL character"),
        ("x" * 4097, "must be at most 4096 bytes"),
    ],
)
def test_a_bad_pattern_says_why(pattern: str, problem: str) -> None:
    assert pattern_problem(pattern) == problem


def test_admission_bounds_of_a_script_and_its_patterns() -> None:
    ok = Script("#!/bin/sh\ntrue\n", "sbatch", "job.sh", ("a",))
    assert Script.from_dict(ok.to_dict()) == ok
    assert admission_problems(ok, "out-%j", "", 1) == []
    big = Script("#!/bin/sh\n" + "é" * MAX_SCRIPT_BYTES, "corral", "x")
    assert admission_problems(big, "", "", 1) == [
        ("script.text", f"must be at most {MAX_SCRIPT_BYTES} bytes, got {2 * MAX_SCRIPT_BYTES + 10}")
    ]
    assert admission_problems(Script("#!/bin/sh\n\0", "corral", "x"), "", "", 1) == [
        ("script.text", "line 2: a NUL character (binary data): a batch script is text")
    ]
    assert admission_problems(Script("echo", "corral", "x"), "", "", 1) == [
        ("script.text", "a batch script starts with #! and its interpreter, e.g. #!/bin/bash")
    ]
    assert admission_problems(None, "o-%q", "e", 2) == [
        ("output", "%q is no pattern corral knows: %j %A %a %u %x, and %% for a % sign"),
        ("error", "a gang's instances each write their own log; --output and --error take a job of one process"),
    ]


def test_launch_paths_of_an_array_task() -> None:
    assert launch_path("o-%A_%a-%j", job="12", user="u", name="", cwd="/w", array_job="10", task="7") == "/w/o-10_7-12"
