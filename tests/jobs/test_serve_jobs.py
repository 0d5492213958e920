"""End to end through the real `corral serve`: a Metronome job created over the Unix socket, run, its run seen in
`corral ps` and in the runs list (Metronome's API and `corral job runs`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.api.test_serve import serving, wait_for


def test_metronome_job_over_the_socket_runs_and_shows_in_ps_and_runs(tmp_path: Path) -> None:
    sock = tmp_path / "corral.sock"
    with serving(sock, tmp_path / "state") as (corral, _):
        api = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://corral/metronome")
        job = {"id": "hello.world", "run": {"cpus": 0.5, "mem": 64, "disk": 0, "cmd": "echo hello from $USER"}}
        created = api.post("/v1/jobs", json=job)
        assert created.status_code == 201, created.text
        assert created.json()["run"]["restart"] == {"policy": "NEVER"}
        again = api.post("/v1/jobs", json=job)
        assert again.status_code == 409 and again.json() == {"message": "Job with this id already exists"}

        run = api.post("/v1/jobs/hello.world/runs")
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        task = run.json()["tasks"][0]["id"]

        def finished() -> bool:
            return bool(api.get(f"/v1/jobs/hello.world/runs/{run_id}").json()["status"] == "SUCCESS")

        wait_for("the run to succeed", finished)
        ps = corral.jobs()
        assert ps[task]["origin"] == f"metronome:hello.world:{run_id}" and ps[task]["state"] == "succeeded"
        assert ps[task]["name"] == "hello.world"
        assert corral.run("logs", task).stdout.startswith("hello from ")
        assert api.get("/v1/jobs/hello.world/runs").json() == []  # Metronome lists active runs only
        history = api.get("/v1/jobs/hello.world", params={"embed": "history"}).json()["history"]
        assert history["successCount"] == 1 and history["successfulFinishedRuns"][0]["id"] == run_id

        runs = json.loads(corral.run("job", "runs", "hello.world", "--json").stdout)
        assert [(r["id"], r["status"], [t["id"] for t in r["tasks"]]) for r in runs] == [(run_id, "SUCCESS", [task])]
        corral.env["COLUMNS"] = "200"  # rich wraps a table to the terminal's width
        listed = corral.run("job", "list").stdout
        assert "hello.world" in listed and "metronome" in listed and "1/0" in listed

        # a Chronos job from a file through the CLI, run by hand, deleted
        spec = tmp_path / "chronos.json"
        spec.write_text(json.dumps({"name": "tidy", "command": "true", "schedule": "R/2030-01-01T00:00:00Z/P1D"}))
        assert corral.run("job", "create", "-f", str(spec)).stdout.startswith("job tidy created (chronos)")
        shown = json.loads(corral.run("job", "show", "tidy", "--json").stdout)
        assert shown["next_run_at"] == "2030-01-01T00:00:00.000Z" and shown["spec"]["schedule"].startswith("R/2030")
        second = corral.run("job", "run", "tidy").stdout.splitlines()[0]
        wait_for("tidy's run", lambda: json.loads(corral.run("job", "runs", "tidy", "--json").stdout)[0]["status"]
                 == "SUCCESS")  # fmt: skip
        assert json.loads(corral.run("job", "runs", "tidy", "--json").stdout)[0]["id"] == second
        corral.run("job", "delete", "tidy")
        gone = corral.run("job", "show", "tidy", ok=False)
        assert gone.returncode == 2 and gone.stderr.strip() == "error: name: no job definition 'tidy'"
        api.close()
