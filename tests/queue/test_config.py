"""The queues file: parsed into base units, and every mistake refused with the file, the key and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.queue.config import Amounts, QueueConfigError, load_queues, parse_queues, validate_against_machine

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
