"""corral's own bodies refuse fields they do not know (issue 23, item 6): `"time_limit_s": 4` once gave a job with no
time limit at all. The peers' faces keep their peers' rules (tests/mesos, tests/services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from corral.api.schemas import CancelManyIn, SubmitIn, TokenIn
from corral.cli import client
from tests.api.test_api import ALICE, ROOT, World


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_an_unknown_field_of_a_submission_is_a_422_naming_it_and_the_field_meant(world: World) -> None:
    alice = world.client(ALICE)
    r = alice.post("/v1/jobs", json={"command": ["train.py"], "time_limit_s": 4})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail["field"] == "time_limit_s"
    assert detail["message"] == (
        "unknown field (did you mean 'time_limit'?); the fields are: " + ", ".join(SubmitIn.model_fields)
    )
    assert alice.get("/v1/jobs").json() == []  # nothing was made
    r = alice.post("/v1/jobs", json={"command": ["x"], "gpu": 1, "zzz": 1, "qqq": 2})
    assert r.status_code == 422
    assert r.json()["detail"]["field"] == "gpu"
    assert r.json()["detail"]["message"].startswith("unknown field (did you mean 'gpus'?); also unknown: zzz, qqq;")
    r = alice.post("/v1/jobs", json={"command": ["x"], "colour": "red"})
    assert r.json()["detail"]["message"].startswith("unknown field; the fields are: command, gpus,")
    assert alice.post("/v1/jobs", json={"command": ["x"], "time_limit": "4s"}).status_code == 201


def test_other_corral_bodies_refuse_unknown_fields(world: World) -> None:
    alice, root = world.client(ALICE), world.client(ROOT)
    r = alice.post("/v1/jobs/cancel", json={"state": "queued", "names": "x"})
    assert r.status_code == 422
    assert r.json()["detail"] == {
        "field": "names",
        "message": "unknown field (did you mean 'name'?); the fields are: ids, state, name, user, all",
    }
    r = root.post("/v1/tokens", json={"name": "ci", "owner": "alice"})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "owner"
    # other errors are told as before
    r = alice.post("/v1/jobs", json={"command": ["x"], "gpus": -1})
    assert r.status_code == 422 and r.json()["detail"]["field"] == "gpus"


def test_the_cli_sends_only_fields_the_api_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    """`corral submit` (with every option), `corral cancel` and `corral token create`: each body they send holds only
    fields of the model its route takes."""
    sent: list[tuple[str, Any]] = []

    class Answer:
        def json(self) -> Any:
            return {"id": "1", "token": "t", "name": "n", "user": "u", "cancelled": [], "cancelling": [],
                    "ended": [], "not_found": []}  # fmt: skip

    def call(_socket: Any, _method: str, url: str, *_: Any, json: Any = None, **__: Any) -> Answer:
        sent.append((url, json))
        return Answer()

    monkeypatch.setattr(client, "call", call)
    runner = CliRunner()
    submit = ["--gpus", "2", "--gpu-memory", "10GiB", "--cpus", "2", "--memory", "4GiB", "--gpu-model", "A100",
              "--priority", "3", "--name", "n", "--queue", "q", "--retries", "1", "--time-limit", "1h",
              "--no-preempt", "--instances", "2", "--gang", "--", "x"]  # fmt: skip
    for cmd, args in ((client.submit_cmd, submit), (client.cancel_cmd, ["--state", "queued", "--name", "n"]),
                      (client.token_create_cmd, ["laptop"])):  # fmt: skip
        result = runner.invoke(cmd, args)
        assert result.exit_code == 0, result.output
    models: dict[str, type[BaseModel]] = {"/v1/jobs": SubmitIn, "/v1/jobs/cancel": CancelManyIn, "/v1/tokens": TokenIn}
    assert [url for url, _ in sent] == list(models)
    for url, body in sent:
        known = set(models[url].model_fields)
        assert set(body) <= known, (url, set(body) - known)
