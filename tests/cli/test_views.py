"""The thin client's wording of the daemon's answers (corral.cli.views): pure functions, no daemon."""

from __future__ import annotations

import time
from datetime import datetime

from corral.cli.views import (
    ago,
    explain_text,
    flag_error,
    gpus_text,
    iso,
    iso_times,
    machine_words,
    short_reason,
    show_lines,
)

NOW = 1_795_000_000.0


def test_gpus_column_names_indices_and_shares() -> None:
    whole = {"gpus": [{"index": 0, "milli": 1000, "memory_mib": 81920}, {"index": 1, "milli": 1000}]}
    assert gpus_text(whole) == "0,1"
    assert gpus_text({"gpus": [{"index": 1, "milli": 1000, "memory_mib": 0}]}) == "1"
    assert gpus_text({"gpus": [{"index": 0, "milli": 300, "memory_mib": 10240}]}) == "0:300m/10GiB"
    assert gpus_text({"gpus": [{"index": 1, "milli": 0, "memory_mib": 1536}]}) == "1:1536MiB"  # a share by memory
    assert gpus_text({"gpus": [{"index": 0, "milli": 250, "memory_mib": 0}]}) == "0:250m"
    assert gpus_text({"gpus": []}) == "-"


def test_times_are_relative_in_tables_and_iso_in_json() -> None:
    assert [ago(NOW - d, NOW) for d in (0.2, 5, 190, 7300, 200000)] == ["now", "5s ago", "3m ago", "2h ago", "2d ago"]
    assert ago(NOW + 7200, NOW) == "in 2h" and ago(None, NOW) == "-"
    stamp = iso(NOW)
    assert stamp is not None and datetime.fromisoformat(stamp).timestamp() == int(NOW)
    job = {"id": "1", "submitted_at": NOW, "started_at": None, "finished_at": NOW + 1.5, "exit_code": 0}
    converted = iso_times([job])[0]
    assert converted["submitted_at"] == iso(NOW) and converted["started_at"] is None
    assert converted["finished_at"] == iso(NOW + 1.5) and converted["exit_code"] == 0


def test_one_machine_wording_and_cluster_wording() -> None:
    one = "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"
    assert machine_words(one) == "does not fit on this machine now: insufficient GPU (need 1 whole GPU)"
    never = "can never run on this machine: 0/1 nodes fit: 1 fewer than 8 eligible GPUs"
    assert machine_words(never) == "can never run on this machine: fewer than 8 eligible GPUs"
    cluster = "0/3 nodes fit: 2 insufficient GPU (need 2 whole GPUs), 1 no GPUs"
    assert machine_words(cluster) == cluster  # a cluster is still spoken of as one
    declined = machine_words("0/1 nodes fit: 1 DeclinedScarceResources")
    assert declined == (
        "the job needs no GPU, and the GPU behaviour keeps this machine for GPU work while it has a free GPU "
        "(DeclinedScarceResources)"
    )
    queued = {"state": "queued", "reason": "0/1 nodes fit: 1 DeclinedScarceResources"}
    assert short_reason(queued) == "GPUs free: kept for GPU work (DeclinedScarceResources)"
    chose = machine_words("2/2 nodes fit; chose sim-0 GPU 0,1 (binpack score 15.3516)")
    assert chose == "2/2 nodes fit; chose sim-0 GPU 0,1 (binpack score 15.3516 of 100, higher preferred)"
    assert machine_words("1/2 nodes fit; chose a (fgd-priced score 3)") == (
        "1/2 nodes fit; chose a (fgd-priced score 3, on that policy's own scale)"
    )
    assert machine_words("1/1 nodes fit; chose sim-0 GPU 0 (binpack score 5.20312)") == (
        "fits this machine; chose GPU 0 (binpack score 5.20312 of 100, higher preferred)"
    )
    note = "no node without free GPUs fit; placed on a GPU node, keeping the per-GPU reserve free"
    assert "node" not in machine_words(note) and "reserve" in machine_words(note)
    assert machine_words("exit code 3") == "exit code 3" and machine_words("") == ""


def test_reason_column_is_one_short_line() -> None:
    long = "0/1 nodes fit: 1 insufficient GPU (need 4 whole GPUs and a great deal more text than fits a column)"
    cell = short_reason({"state": "queued", "reason": long})
    assert cell.startswith("insufficient GPU (need 4 whole GPUs") and cell.endswith("…") and len(cell) <= 60
    assert short_reason({"state": "failed", "reason": "exit code 3\nmore\nlines"}) == "exit code 3…"
    assert short_reason({"state": "running", "reason": "no node without free GPUs fit; ..."}) == "-"
    assert short_reason({"state": "cancelled", "reason": ""}) == "-"


def test_explain_sentences_for_each_state() -> None:
    assert explain_text("3", {"state": "running", "reason": ""}) == ["job 3 is running"]
    assert explain_text("1", {"state": "succeeded", "reason": "exit code 0"}) == ["job 1 succeeded (exit code 0)"]
    assert explain_text("5", {"state": "cancelled", "reason": "cancelled"}) == ["job 5 was cancelled"]
    assert explain_text("6", {"state": "failed", "reason": "exit code 3"}) == ["job 6 failed: exit code 3"]
    waiting = explain_text("7", {"state": "queued", "reason": "0/1 nodes fit: 1 insufficient GPU (need 1 whole GPU)"})
    assert waiting == ["job 7 is waiting: does not fit on this machine now: insufficient GPU (need 1 whole GPU)"]
    # whatever else the answer carries (a newer daemon's parts) is shown too, a line each
    more = explain_text("7", {"state": "queued", "reason": "", "queue_rank": 2, "blockers": ["4", "5"]})
    assert more == ["job 7 is waiting for its turn", "queue rank: 2", "blockers: 4, 5"]
    soon = time.time() + 7300
    window = explain_text("7", {"state": "queued", "reason": "", "window": {"gpus": [0, 1], "start_at": soon}})
    assert window[1] == "window: gpus 0, 1, start at in 2h"
    # the daemon's queue story: a sentence a line, and its fields (for --json) not repeated
    story = explain_text("7", {
        "state": "queued", "reason": "0/1 nodes fit: 1 insufficient GPU (need 2 whole GPUs)", "position": 1,
        "queued": 3, "holders": [{"job": "2", "owner": None, "gpus": [0], "expected_end": soon}],
        "reservation": {"job": "7", "gpus": [0, 1], "start": soon}, "estimated_start": soon,
        "default_time_limit_s": 3600.0,
        "story": "Position 1 of 3 in the queue. Held by job 2 (another user, GPU 0, expected to end by "
        "2026-11-26 22:31:56 UTC). Reserved for it: GPUs 0, 1 from 2026-11-26 22:31:56 UTC (estimated start).",
    })  # fmt: skip
    assert story == [
        "job 7 is waiting: does not fit on this machine now: insufficient GPU (need 2 whole GPUs)",
        "Position 1 of 3 in the queue.",
        "Held by job 2 (another user, GPU 0, expected to end by 2026-11-26 22:31:56 UTC).",
        "Reserved for it: GPUs 0, 1 from 2026-11-26 22:31:56 UTC (estimated start).",
    ]


def test_errors_name_the_flags() -> None:
    assert flag_error("gpu_memory_mib", "too much") == "--gpu-memory: too much"
    assert flag_error("gpu_fraction", "less than 1") == "--gpu-fraction: less than 1"
    assert flag_error("request", "can never run on this machine: 0/1 nodes fit: 1 CPU capacity below 9m") == (
        "can never run on this machine: CPU capacity below 9m"
    )
    assert flag_error("run.cpus", "bad", None) == "run.cpus: bad"  # a JSON document's fields stay its own


def test_show_has_every_request_field_and_the_command_quoted() -> None:
    job = {
        "id": "4", "name": "", "user": "ann", "state": "queued", "command": ["sh", "-c", "date >> f; sleep 8"],
        "priority": 0, "submitted_at": NOW - 120, "started_at": None, "finished_at": None, "exit_code": None,
        "attempts": 0, "gpus": [], "reason": "", "origin": "", "log_path": "/var/lib/corral/logs/4.log",
        "request": {
            "cpu_milli": 500, "memory_mib": 8192, "gpu_count": 1, "gpu_milli": 300, "gpu_memory_mib": 10240,
            "gpu_models": ["A100"], "time_limit_s": 5400.0, "retries": 2, "cwd": "/home/ann", "env_count": 12,
        },
    }  # fmt: skip
    shown = dict(show_lines(job, now=NOW))
    assert shown["command"] == "sh -c 'date >> f; sleep 8'"
    assert shown["submitted"] == f"{iso(NOW - 120)} (2m ago)" and shown["started"] == "-"
    assert (shown["cpus"], shown["memory"], shown["gpu memory"]) == ("0.5", "8GiB", "10GiB")
    assert shown["gpu models"] == "A100"
    assert shown["gpus"] == "1 share: 30 % of each and 10GiB each"
    assert (shown["time limit"], shown["cwd"], shown["env"]) == ("90m", "/home/ann", "12 variables")
    assert shown["log"] == "/var/lib/corral/logs/4.log" and shown["attempts"] == "0 (retries allowed: 2)"
    assert "." not in shown["submitted"].split("(")[0]  # no epoch floats
