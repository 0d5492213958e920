"""The queues file: parsed into base units, and every mistake refused with the file, the key and the rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.queue.config import load_queues
from corral.tenancy.config import Amounts, QueueConfigError, parse_queues, validate_against_machine

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
half_life = "2d"
default_queue = "dev"
admins = ["ann"]
admin_groups = ["ops"]

[queues.train]
weight = 3
max_priority = 50
submitters = ["ann", "@ml"]
guarantee = { gpus = 2, memory = "64GiB" }
limit = { gpus = 4, gpu_milli = 4000, gpu_memory = "160GiB", cpus = 16, memory = "256GiB" }
borrow_limit = { gpus = 1 }
[queues.train.users.ann]
limit = { gpus = 2 }
weight = 2
max_priority = 10
[queues.train.users."*"]
limit = { cpus = "500m" }
[queues.train.groups.ml]
limit = { gpus = 3 }

[queues.dev]
limit = { gpus = 1 }

[users.bob]
limit = { gpu_milli = 2500 }
[groups.interns]
limit = { gpus = 1 }
"""


def test_a_full_file_reads_into_base_units() -> None:
    c = parse_queues(GOOD, "q.toml")
    assert c.half_life_s == 2 * 86400 and c.default_queue == "dev"
    assert c.admins == {"ann"} and c.admin_groups == {"ops"}
    train = c.queues["train"]
    assert train.weight == 3 and train.max_priority == 50 and train.submitters == ("ann", "@ml")
    assert train.guarantee == Amounts(gpus=2000, memory=65536)  # GPUs in milli: a share counts by its part
    assert train.limit == Amounts(gpus=4000, gpu_milli=4000, gpu_memory=163840, cpus=16000, memory=262144)
    assert train.borrow_limit == Amounts(gpus=1000)
    assert train.user("ann") is not None and train.user("ann").limit == Amounts(gpus=2000)  # type: ignore[union-attr]
    assert train.user("zed") is not None and train.user("zed").limit == Amounts(cpus=500)  # type: ignore[union-attr]
    assert train.groups["ml"].limit == Amounts(gpus=3000)
    assert c.user("bob") is not None and c.groups["interns"].limit == Amounts(gpus=1000)
    assert train.limit.as_dict()["gpus"] == 4  # shown as the file writes it


def test_gpus_may_be_fractions_in_steps_of_a_thousandth() -> None:
    c = parse_queues("[queues.a]\nlimit = { gpus = 1.5 }\nguarantee = { gpus = 0.25 }\n")
    assert c.queues["a"].limit == Amounts(gpus=1500) and c.queues["a"].guarantee == Amounts(gpus=250)
    assert c.queues["a"].limit.as_dict() == {"gpus": 1.5}


def test_no_default_queue_listed_makes_one() -> None:
    c = parse_queues("[queues.a]\nweight = 1\n")
    assert set(c.queues) == {"a", "default"} and c.default_queue == "default"


def test_the_example_file_is_valid() -> None:
    c = load_queues(ROOT / "examples" / "queues.toml")
    assert c.default_queue in c.queues


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[queues.a]\nwieght = 2\n", "q.toml: queues.a.wieght: unknown key"),
        ("colour = 1\n", "q.toml: colour: unknown key"),
        ("[queues.a]\nlimit = { gpus = -1 }\n", "queues.a.limit.gpus: must not be negative, got -1"),
        ("[queues.a]\nlimit = { cpus = nan }\n", "queues.a.limit.cpus: must be finite"),
        ("[queues.a]\nlimit = { gpus = 1.0005 }\n", "queues.a.limit.gpus: must be a number of GPUs in steps of 0.001"),
        ("[queues.a]\nlimit = { gpus = \"2\" }\n", "queues.a.limit.gpus: must be a number of GPUs (1.5: one"),
        ("[queues.a]\nlimit = { gpus = 99999999999 }\n", "queues.a.limit.gpus: must be at most"),
        ("[queues.a]\nlimit = { memory = \"lots\" }\n", "queues.a.limit.memory: not a memory amount"),
        ("[queues.a]\nlimit = { disks = 1 }\n", "queues.a.limit.disks: unknown key"),
        ("[queues.a]\nweight = 0\n", "queues.a.weight: must be > 0"),
        ("[queues.a]\nweight = inf\n", "queues.a.weight: must be a finite number"),
        ("[queues.a]\nguarantee = { gpus = 3 }\nlimit = { gpus = 2 }\n",
         "queues.a.guarantee.gpus: is 3, above the queue's limit of 2"),
        ("[queues.a]\nmax_priority = 1.5\n", "queues.a.max_priority: must be a whole number"),
        ("[queues.\"a b\"]\n", "queues.a b: a name is 1-64 letters"),
        ("default_queue = \"nope\"\n[queues.a]\n", "default_queue: names no queue of this file: 'nope'"),
        ("half_life = \"soon\"\n", "half_life: not a duration"),
        ("half_life = \"0s\"\n", "half_life: must be more than 0 seconds"),
        ("[queues.a]\nsubmitters = \"ann\"\n", "queues.a.submitters: must be a list of names"),
        ("[queues.a\n", "q.toml: not valid TOML"),
        ("min_runtime = \"2d\"\n", "q.toml: min_runtime: must be from 0 to 86400 seconds, got '2d'"),
        ("[queues.a]\nmin_runtime = \"soon\"\n", "queues.a.min_runtime: not a duration: 'soon'"),
        ("[queues.a]\nmin_runtime = true\n", "queues.a.min_runtime: must be a duration such as '5m', got True"),
    ],
)  # fmt: skip
def test_mistakes_name_the_file_the_key_and_the_rule(text: str, words: str) -> None:
    with pytest.raises(QueueConfigError) as caught:
        parse_queues(text, "q.toml")
    assert words in str(caught.value)
    assert str(caught.value).startswith("q.toml: ")


def test_guarantees_above_the_machine_are_refused() -> None:
    c = parse_queues("[queues.a]\nguarantee = { gpus = 3 }\n[queues.b]\nguarantee = { gpus = 2 }\n", "q.toml")
    validate_against_machine(c, (8000, 8000, 0, 64000, 100000))
    with pytest.raises(
        QueueConfigError, match=r"guarantee\.gpus: the guarantees add up to 5 GPUs, more than the machine's 4"
    ):
        validate_against_machine(c, (4000, 4000, 0, 64000, 100000))


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(QueueConfigError, match="cannot read the queues file"):
        load_queues(tmp_path / "missing.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(QueueConfigError, match="not UTF-8"):
        load_queues(bad)


# ------------------------------------------------------------------------------------------------ bounds (issue 23)
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n",
         "q.toml: line 1: arrays and inline tables nested more than 16 deep (the most a queues file may nest)"),
        ("a = " + "{b = " * 20 + "1" + "}" * 20 + "\n",
         "q.toml: line 1: arrays and inline tables nested more than 16 deep"),
        ("\n\na" + ".a" * 100_000 + " = 1\n",
         "q.toml: line 3: a dotted key of more than 16 parts (the most a queues file may nest)"),
        ("".join(f"[queues.q{i}]\n" for i in range(200_000)),
         "q.toml: the file is more than 1048576 bytes (a queues file may have at most 1048576)"),
        ("".join(f"[q.q{i}]\n" for i in range(50_001)),
         "q.toml: 50001 tables, more than the 50000 a queues file may have"),
        ("".join(f"[queues.q{i}]\n" for i in range(1001)),
         "q.toml: queues: 1001 queues, more than the 1000 a file may have"),
        ("[queues.a]\n" + "".join(f"[queues.a.users.u{i}]\n" for i in range(5000))
         + "".join(f"[groups.g{i}]\n" for i in range(5001)),
         "q.toml: users: 10001 user and group entries, more than the 10000 a file may have"),
        ("admins = [" + '"a",' * 10_001 + "]\n", "q.toml: admins: 10001 names, more than the 10000 a list may have"),
    ],
    ids=["nested-arrays", "nested-tables", "dotted-key", "size", "tables", "queues", "users", "names"],
)  # fmt: skip
def test_a_hostile_file_is_refused_naming_the_bound(text: str, words: str) -> None:
    with pytest.raises(QueueConfigError) as caught:
        parse_queues(text, "q.toml")
    assert str(caught.value) == words or str(caught.value).startswith(words)


def test_strings_and_comments_do_not_count_against_the_bounds() -> None:
    deep = "[" * 40
    text = f'# {deep}\nadmins = ["{deep}x"]\n[queues.a]  # {deep}\nweight = 1.5\n'
    with pytest.raises(QueueConfigError, match=r"admins: a name is 1-64 letters"):
        parse_queues(text, "q.toml")  # read past the scan: the brackets were in a comment and a string
    c = parse_queues(f"# {deep}\n[queues.a]\nweight = 1.5 # {'.' * 40}\n" + '[queues."b"]\n', "q.toml")
    assert set(c.queues) == {"a", "b", "default"}


def test_a_large_file_is_read_no_further_than_the_bound(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * (8 * 1024 * 1024) + b"\n")
    with pytest.raises(QueueConfigError) as caught:
        load_queues(big)
    assert str(caught.value) == f"{big}: the file is more than 1048576 bytes (a queues file may have at most 1048576)"


def test_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    # A FIFO at the queues file's path would have blocked a reload for ever (under the daemon's lock, on SIGHUP).
    fifo = tmp_path / "queues.toml"
    os.mkfifo(fifo)
    with pytest.raises(QueueConfigError, match=r"not a regular file \(a queues file is a TOML file\)"):
        load_queues(fifo)
    with pytest.raises(QueueConfigError, match="cannot read the queues file: Is a directory"):
        load_queues(tmp_path)
