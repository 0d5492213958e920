"""Slurm's spellings where a user types them (issue 26, item 1): --time 1:30:00, ps --state pending, ps -u USER,
--gres gpu:N, and --gpus 0.5 answered with corral's own error naming --gpu-fraction.

The CLI's side with the request it would send caught (no daemon); the API's side in-process (tests/api/test_api.py's
World: a daemon core with the fake executor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from corral.cli import client
from tests.api.test_api import ALICE, BOB, ROOT, World, submit


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, Any]]:
    """(url, params, body) of every request the command makes; each answered with a job."""
    calls: list[tuple[str, Any, Any]] = []

    class Answer:
        headers: ClassVar[dict[str, str]] = {}

        def json(self) -> Any:
            return [] if calls[-1][0] == "/v1/jobs" and calls[-1][2] is None else {"id": "1"}

    def call(_socket: Any, _method: str, url: str, *_: Any, params: Any = None, json: Any = None, **__: Any) -> Any:
        calls.append((url, params, json))
        return Answer()

    monkeypatch.setattr(client, "call", call)
    return calls


def run(cmd: Any, args: list[str]) -> Any:
    return CliRunner().invoke(cmd, args)


def test_gpus_half_is_a_corral_error_that_names_gpu_fraction(sent: list[tuple[str, Any, Any]]) -> None:
    result = run(client.submit_cmd, ["--gpus", "0.5", "--", "train.py"])
    assert result.exit_code == 2
    assert result.output == (
        "error: --gpus: a whole number of GPUs, got '0.5'; for a share of one GPU use --gpu-fraction 0.5 (with "
        "--gpu-memory for its memory)\n"
    )
    assert "Traceback" not in result.output and "Invalid value" not in result.output
    result = run(client.submit_cmd, ["--gpus", "two", "--", "train.py"])
    assert (result.exit_code, result.output) == (2, "error: --gpus: a whole number of GPUs, got 'two'\n")
    assert sent == []  # nothing was sent


@pytest.mark.parametrize(
    ("gres", "gpus", "models"),
    [("gpu:2", 2, []), ("gpu:H100-80GB:1", 1, ["H100-80GB"]), ("gpu:0", 0, [])],
)
def test_gres_gpu_is_gpus_and_a_model(
    sent: list[tuple[str, Any, Any]], gres: str, gpus: int, models: list[str]
) -> None:
    result = run(client.submit_cmd, ["--gres", gres, "--", "train.py"])
    assert result.exit_code == 0, result.output
    body = sent[-1][2]
    assert (body["gpus"], body["gpu_model"]) == (gpus, models)


@pytest.mark.parametrize("gres", ["mps:1", "gpu", "gpu:", "gpu::1", "gpu:a:b:1", "gpu:two"])
def test_a_gres_other_than_gpus_is_refused_naming_the_forms(sent: list[tuple[str, Any, Any]], gres: str) -> None:
    result = run(client.submit_cmd, ["--gres", gres, "--", "train.py"])
    assert result.exit_code == 2
    assert result.output == (
        f"error: --gres: give gpu:N or gpu:MODEL:N (GPUs are the only generic resource here), got {gres!r}\n"
    )


def test_gres_and_gpus_together_are_refused(sent: list[tuple[str, Any, Any]]) -> None:
    result = run(client.submit_cmd, ["--gres", "gpu:1", "--gpus", "2", "--", "train.py"])
    assert (result.exit_code, result.output) == (
        2,
        "error: --gres: give the GPUs once: --gpus N or --gres gpu:N, not both\n",
    )


def test_time_is_time_limit_and_takes_slurm_forms(sent: list[tuple[str, Any, Any]]) -> None:
    for flag in ("--time", "-t", "--time-limit"):
        assert run(client.submit_cmd, [flag, "1:30:00", "--", "train.py"]).exit_code == 0
        assert sent[-1][2]["time_limit"] == "1:30:00"
    assert "D-HH:MM:SS" in run(client.submit_cmd, ["--help"]).output


def test_ps_u_is_user(sent: list[tuple[str, Any, Any]]) -> None:
    result = run(client.ps_cmd, ["-u", "bob", "--state", "pending"])
    assert result.exit_code == 0, result.output
    params = sent[-1][1]
    assert ("user", "bob") in params and ("state", "pending") in params


# ------------------------------------------------------------------------------------------------ the API's side
@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 5400.0), ("1:30", 90.0), ("1:30:00", 5400.0), ("2-12", 216000.0), ("2-12:30:15", 217815.0), ("2h", 7200.0)],
)
def test_a_time_limit_in_slurm_words(world: World, text: str, seconds: float) -> None:
    job = submit(world.client(ALICE), time_limit=text)
    assert job["request"]["time_limit_s"] == seconds


def test_a_bad_slurm_time_is_a_422_naming_time_limit(world: World) -> None:
    r = world.client(ALICE).post("/v1/jobs", json={"command": ["x"], "time_limit": "1:75:00"})
    assert r.status_code == 422
    assert r.json()["detail"] == {
        "field": "time_limit",
        "message": "not a duration: '1:75:00': minutes must be below 60 there",
    }


def test_pending_is_queued(world: World) -> None:
    alice = world.client(ALICE)
    waiting = submit(alice, gpus=2)
    submit(alice, gpus=2)  # the second waits behind the first, which runs
    world.tick()
    pending = alice.get("/v1/jobs", params={"state": "pending"}).json()
    assert [j["state"] for j in pending] == ["queued"]
    assert alice.get("/v1/jobs", params={"state": "PENDING,running"}).json()[0]["id"] == waiting["id"]
    r = alice.get("/v1/jobs", params={"state": "waiting"})
    assert r.status_code == 422
    assert r.json()["detail"]["message"] == (
        "must be one of queued, starting, running, succeeded, failed, cancelled, lost (or pending, Slurm's word for "
        "queued); got waiting"
    )
    r = alice.post("/v1/jobs/cancel", json={"state": "pending"})
    assert r.status_code == 200 and len(r.json()["cancelled"]) == 1


def test_ps_u_as_root_lists_that_users_jobs_and_a_user_gets_a_403(world: World) -> None:
    """Decided: a user may name only themselves (-u alice as alice); another user's jobs are refused with a 403 that
    says so, rather than an empty list that would read as 'bob has no jobs'."""
    submit(world.client(ALICE))
    bobs = submit(world.client(BOB))
    root = world.client(ROOT)
    assert [j["id"] for j in root.get("/v1/jobs", params={"user": "bob"}).json()] == [bobs["id"]]
    alice = world.client(ALICE)
    assert len(alice.get("/v1/jobs", params={"user": "alice"}).json()) == 1
    r = alice.get("/v1/jobs", params={"user": "bob"})
    assert r.status_code == 403
    assert r.json()["detail"] == {"field": "user", "message": "only root can see or cancel other users' jobs"}
    assert client.flag_errors(r) == "--user: only root can see or cancel other users' jobs"
