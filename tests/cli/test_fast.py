"""corral.cli.fast: `corral submit` and `corral ps` without click send what the click commands send, or hand the
command line to them.

The two parsers are held equal over generated command lines: for each, the fast path either gives up (Fallback:
click runs, and prints what it always printed) or sends the very request the click command sends, byte for byte of
its meaning (the same JSON body, the same query). Both build it with corral.cli.wire's functions; what is tested
here is that both read a command line alike."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.cli import client, fast, transport, wire
from corral.cli.render import Columns, Styled

SUBMIT_OPTIONS = sorted({*fast.SUBMIT.values, *fast.SUBMIT.flags})
PS_OPTIONS = sorted({*fast.PS.values, *fast.PS.flags})
#: What a user might also type: what the fast path does not know, and values of every kind.
ODD = ["--", "-", "--help", "-h", "-x", "--bogus", "-t5", "-ae", "--gang=1", "--name=", "--gpus=2", "--state=queued"]
VALUES = ["1", "2", "0", "-5", "0.5", "1.5", "x", "a b", "gpu:2", "gpu:A100:1", "2h", "1:30:00", "queued,running",
          "pending", "afterok:1", "0-9%2", "10GiB", "500m", "", "é", "nan", "1e3", "root", "job%j.out"]  # fmt: skip
WORDS = ["true", "sleep", "python", "-c", "--gpus", "echo"]


def tokens(options: list[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(
        st.one_of(
            st.sampled_from(options), st.sampled_from(ODD), st.sampled_from(VALUES), st.sampled_from(WORDS),
            st.text(alphabet="ab-=1.", max_size=4),
        ),
        max_size=9,
    )  # fmt: skip


class Sent(Exception):
    """The request the fast path would have sent (raised in place of sending it)."""

    def __init__(self, method: str, where: str, body: bytes | None, headers: dict[str, str]) -> None:
        super().__init__(method, where)
        self.method, self.where, self.body, self.headers = method, where, body, headers


def fast_request(command: str, argv: list[str]) -> Sent | None:
    """What the fast path sends for `corral COMMAND ARGV` (None: it hands the command line to click)."""

    def capture(path: str, method: str, where: str, body: bytes | None, headers: Any) -> Any:
        raise Sent(method, where, body, dict(headers))

    with mock.patch.object(wire, "exchange", capture), mock.patch.dict(os.environ, {"CORRAL_SOCKET": "/nowhere"}):
        try:
            fast.COMMANDS[command](argv)
        except fast.Fallback:
            return None
        except Sent as sent:
            return sent
    raise AssertionError("sent nothing")


def click_requests(command: Any, argv: list[str]) -> tuple[list[tuple[str, str, Any]], Any]:
    """The requests the click command makes for ARGV (method, target, JSON body), and its result."""
    made: list[tuple[str, str, Any]] = []

    def call(_socket: Any, method: str, url: str, *_: Any, params: Any = None, json: Any = None, **__: Any) -> Any:
        made.append((method, transport.target("", url, params), json))
        return transport.Response(200, transport.Headers(), b"[]" if method == "GET" else b'{"id": "1"}')

    with mock.patch.object(client, "call", call):
        result = CliRunner().invoke(command, argv)
    return made, result


@pytest.fixture(autouse=True)
def a_fixed_clock() -> Iterator[None]:
    """`ps` sends "ended_after" (an hour ago): the same clock for both."""
    with mock.patch("time.time", return_value=1_800_000_000.5):
        yield


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens(SUBMIT_OPTIONS))
@example(["--gpus", "1", "--", "true"])
@example(["--priority", "-5", "--name", "--gang", "-t", "1:30:00", "sleep", "--gpus", "9"])
@example(["--gres", "gpu:A100:2", "--gpu-model", "H100", "--gpu-model", "x", "--", "a", "--", "b"])
@example(["--gpus", "0.5", "true"])
def test_submit_sends_what_the_click_command_sends(argv: list[str]) -> None:
    sent = fast_request("submit", argv)
    if sent is None:
        return  # click's to run
    made, result = click_requests(client.submit_cmd, argv)
    assert result.exit_code == 0, f"the fast path took {argv} but click refuses it: {result.output}"
    [(method, where, body)] = made
    assert (sent.method, sent.where) == (method, where) == ("POST", "/v1/jobs")
    assert sent.body is not None and json.loads(sent.body) == body
    assert sent.headers["Content-Type"] == "application/json"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens(PS_OPTIONS))
@example([])
@example(["-a", "--state", "queued,running", "--state", "pending", "-u", "root", "--limit", "5", "--json"])
@example(["--since", "2h", "--newest", "--array", "7_[1-3]", "-e", "--after", "12"])
@example(["--name", "a b/é&x=1"])
def test_ps_asks_what_the_click_command_asks(argv: list[str]) -> None:
    sent = fast_request("ps", argv)
    if sent is None:
        return
    made, result = click_requests(client.ps_cmd, argv)
    assert result.exit_code == 0, f"the fast path took {argv} but click refuses it: {result.output}"
    assert made and (sent.method, sent.where, sent.body) == ("GET", made[0][1], None)


def test_the_common_forms_take_the_fast_path() -> None:
    for argv in (
        ["--gpus", "1", "--", "python", "train.py"],
        ["--cpus", "100m", "--memory", "16MiB", "--gpus", "2", "--", "true"],
        ["--name=sweep", "-t", "1:30:00", "--array", "0-99%8", "--dependency", "afterok:3", "sleep", "1"],
    ):
        assert fast_request("submit", argv) is not None, argv
    for argv in ([], ["-a"], ["--state", "pending", "--json"], ["-u", "root", "--limit", "100"]):
        assert fast_request("ps", argv) is not None, argv
    for argv in (["--help"], ["-t5", "x"], ["--gpus"], [], ["--gpus", "0.5", "x"], ["--priority", "x", "y"]):
        assert fast_request("submit", argv) is None, argv  # click's: its help, its errors
    for argv in (["extra"], ["--limit", "0"], ["--since", "soon"], ["-ae"]):
        assert fast_request("ps", argv) is None, argv


@pytest.mark.parametrize(
    "value",
    ["", "plain", "a b", 'q"uote\\', "é\u202e\U0001f600", "\ud800", "\x00\x1f"],
)
def test_wire_json_is_json(value: str) -> None:
    body = {"s": value, "n": None, "t": True, "f": False, "i": -3, "x": 0.1, "l": [value, 1], "d": {"k": [value]}}
    assert json.loads(wire.dumps(body)) == body
    assert wire.loads(json.dumps(body).encode()) == body
    assert wire.dumps(body) == json.dumps(body).encode()


def test_wire_loads_refuses_what_is_not_one_document() -> None:
    for bad in (b"", b"{", b"[] []", b"nope"):
        with pytest.raises(ValueError):
            wire.loads(bad)
    assert wire.loads(b' {"a": [1, 2.5, NaN]} \n')["a"][:2] == [1, 2.5]


@given(st.lists(st.tuples(st.text(max_size=5), st.one_of(st.text(max_size=8), st.integers(), st.floats()))))
def test_wire_query_is_urlencode(params: list[tuple[str, Any]]) -> None:
    from urllib.parse import quote, urlencode

    assert wire.query(params) == urlencode(params, doseq=True, quote_via=quote)


def test_an_idempotency_key_is_a_uuid4() -> None:
    import uuid

    keys = {wire.idempotency_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(uuid.UUID(k).version == 4 and str(uuid.UUID(k)) == k for k in keys)


# ------------------------------------------------------------------------------------------------ a daemon's answers
class FakeDaemon:
    """A Unix socket that answers each request with the next of `answers` (raw HTTP; b"" closes without one) and
    records what came."""

    def __init__(self, path: Path, answers: list[bytes]) -> None:
        import socket

        self.answers = answers
        self.requests: list[bytes] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.answers:
            conn, _ = self.server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                sizes = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                length = sizes[0] if sizes else 0
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(self.answers.pop(0))

    def close(self) -> None:
        self.server.close()


def http(status: str, body: bytes, *headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", "content-type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def run_main(argv: list[str], sock: Path) -> tuple[int, str, str]:
    """`corral ARGV` through the console script's entry point: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.object(wire, "preset_key", None),
        mock.patch("sys.argv", ["corral", *argv]),
        mock.patch.dict(os.environ, {"CORRAL_SOCKET": str(sock), "NO_COLOR": "1"}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = fast.main()
        except SystemExit as done:
            code = done.code
    return int(code or 0), out.getvalue(), err.getvalue()


def test_a_submission_whose_answer_was_lost_is_sent_again_with_its_key(tmp_path: Path) -> None:
    """The fast path sent it and the connection closed: click resends it with the same Idempotency-Key, so a daemon
    that made the job answers with it again, and there is one job."""
    daemon = FakeDaemon(tmp_path / "s", [b"", http("200 OK", b'{"id": "41"}')])
    try:
        code, out, _ = run_main(["submit", "--gpus", "1", "--", "true"], tmp_path / "s")
    finally:
        daemon.close()
    assert (code, out) == (0, "41\n")
    keys = [line for r in daemon.requests for line in r.decode().split("\r\n") if line.startswith("Idempotency-Key")]
    assert len(keys) == 2 and keys[0] == keys[1]
    first, second = (json.loads(r.partition(b"\r\n\r\n")[2]) for r in daemon.requests)
    assert first == second


def test_an_error_answer_is_worded_by_the_click_command(tmp_path: Path) -> None:
    refused = http("422 Unprocessable Entity", b'{"detail": {"field": "time_limit", "message": "not a duration"}}')
    daemon = FakeDaemon(tmp_path / "s", [refused, refused])
    try:
        code, out, err = run_main(["submit", "--time-limit", "soon", "--", "true"], tmp_path / "s")
    finally:
        daemon.close()
    assert (code, out) == (2, "")
    assert err == "error: --time-limit: not a duration\n"


def test_ps_prints_the_table_the_click_command_prints(tmp_path: Path) -> None:
    page = [
        {"id": "1", "name": "", "user": "ann", "state": "running", "command": ["sleep", "9"],
         "gpus": [{"index": 0}, {"index": 1}],
         "submitted_at": 1_800_000_000.5 - 120, "finished_at": None, "reason": "", "preempted": None,
         "array_job_id": None, "array_task_id": None, "array": None},
    ]  # fmt: skip
    answer = http("200 OK", json.dumps(page).encode())
    daemon = FakeDaemon(tmp_path / "s", [answer])
    try:
        code, out, err = run_main(["ps"], tmp_path / "s")
    finally:
        daemon.close()
    assert (code, err) == (0, "")
    assert "GET /v1/jobs?ended_after=" in daemon.requests[0].decode()
    _, result = click_requests_with(client.ps_cmd, [], [page])
    assert out == result.output
    assert out.splitlines()[1].split() == ["1", "-", "ann", "running", "0,1", "2m", "ago", "-", "sleep", "9", "-"]


def click_requests_with(command: Any, argv: list[str], pages: list[Any]) -> tuple[list[Any], Any]:
    made: list[Any] = []

    def call(_socket: Any, method: str, url: str, *_: Any, params: Any = None, **__: Any) -> Any:
        made.append((method, url, params))
        return transport.Response(200, transport.Headers(), json.dumps(pages.pop(0)).encode())

    with mock.patch.object(client, "call", call), mock.patch.dict(os.environ, {"NO_COLOR": "1"}):
        return made, CliRunner().invoke(command, argv)


def test_ps_of_another_users_jobs_is_refused_in_clicks_words(tmp_path: Path) -> None:
    refused = http("403 Forbidden", b'{"detail": {"field": "user", "message": "only root lists other users\' jobs"}}')
    daemon = FakeDaemon(tmp_path / "s", [refused, refused])
    try:
        code, out, err = run_main(["ps", "-u", "bob"], tmp_path / "s")
    finally:
        daemon.close()
    assert (code, out) == (2, "")
    assert err == "error: --user: only root lists other users' jobs\n"


def test_no_daemon_is_said_as_before(tmp_path: Path) -> None:
    code, out, err = run_main(["submit", "--", "true"], tmp_path / "none")
    assert (code, out) == (2, "")
    assert err == f"error: corral serve is not running at {tmp_path / 'none'}\n"


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.text(max_size=6), st.sampled_from(["ok", "名前", "\x1b[2J", "a\tb", "", "ünï"]),
                st.builds(lambda t: Styled(t, "green"), st.text(max_size=4)),
                st.integers(), st.none(),
            ),
            min_size=3, max_size=3,
        ),
        max_size=6,
    )
)  # fmt: skip
def test_a_piped_table_drawn_by_columns_is_the_one_drawn_cell_by_cell(rows: list[list[object]]) -> None:
    """render.Columns draws a piped table a column at a time (corral ps of 5,000 jobs); the lines are those of the
    cell-by-cell drawing (which a colour terminal still uses)."""
    view = Columns("ID", "NAME", "REASON")
    for r in rows:
        view.add_row(*r)
    grid = [tuple((h, "", len(h)) for h in view.headers), *view.rows]
    widths = [max(row[i][2] for row in grid) for i in range(3)]
    expected = [
        "   ".join(t if i == 2 else t + " " * (widths[i] - w) for i, (t, _, w) in enumerate(row)).rstrip()
        for row in grid
    ]
    assert view.lines(color=False, cells=None) == expected


def test_ps_words_each_reason_once_and_each_row_as_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """listing.show keeps a REASON cell by (state, reason) for jobs never preempted: every row still reads as
    views.short_reason words it alone (a preempted job's cell names its preemption)."""
    from corral.cli import listing
    from corral.cli.views import short_reason

    now = 1_800_000_000.0
    base = {"name": "", "user": "ann", "command": ["true"], "gpus": [], "submitted_at": now - 60, "finished_at": None,
            "array_job_id": "", "array_task_id": None, "array": "", "preempted": None}  # fmt: skip
    why = "0/1 nodes fit: 1 insufficient GPU (need 4 whole GPUs)"
    jobs = [
        {**base, "id": "1", "state": "queued", "reason": why},
        {**base, "id": "2", "state": "queued", "reason": why, "preempted": {"count": 1, "at": now - 5, "reason": "x"}},
        {**base, "id": "3", "state": "queued", "reason": why},
        {**base, "id": "4", "state": "running", "reason": why},
        {**base, "id": "5", "state": "failed", "reason": "exit code 3", "finished_at": now - 1},
    ]
    with mock.patch.dict(os.environ, {"NO_COLOR": "1"}):
        listing.show(listing.columns_of([dict(j) for j in jobs]), None, None, False, False, now)
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.rstrip().endswith(short_reason(j, now)) for line, j in zip(lines, jobs, strict=True)] == [True] * 5
    assert short_reason(jobs[1], now) != short_reason(jobs[0], now)


@pytest.mark.parametrize("entry", ["corral.cli.fast", "corral.cli.main"])
def test_ps_into_a_pipe_closed_early_ends_quietly(tmp_path: Path, entry: str) -> None:
    """`corral ps | head -1`: the reader gone, status 1 and nothing on stderr, on the fast path as through click."""
    import subprocess
    import sys

    page = [
        {"id": "1", "name": "", "user": "ann", "state": "queued", "command": ["true"], "gpus": [],
         "submitted_at": 1.0, "finished_at": None, "reason": "", "preempted": None, "array_job_id": "",
         "array_task_id": None, "array": ""}
    ]  # fmt: skip
    daemon = FakeDaemon(tmp_path / "s", [http("200 OK", json.dumps(page).encode())])
    root = Path(__file__).resolve().parents[2]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write fails (EPIPE)
    try:
        done = subprocess.run(
            [sys.executable, "-c", f"import sys\nfrom {entry} import main\nsys.exit(main())", "ps"],
            stdout=write, stderr=subprocess.PIPE, cwd=tmp_path, timeout=60,
            env={**os.environ, "PYTHONPATH": str(root), "CORRAL_SOCKET": str(tmp_path / "s"), "NO_COLOR": "1"},
        )  # fmt: skip
    finally:
        os.close(write)
        daemon.close()
    assert (done.returncode, done.stderr) == (1, b"")


def test_ctrl_c_is_said_as_click_says_it(tmp_path: Path) -> None:
    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    with mock.patch.object(wire, "exchange", interrupted):
        fast_result = run_main(["ps"], tmp_path / "s")
    with mock.patch.object(transport, "exchange", interrupted):  # the click command, interrupted alike
        done = CliRunner().invoke(client.ps_cmd, [], env={"CORRAL_SOCKET": str(tmp_path / "s")})
    assert fast_result == (1, "", "\nAborted!\n")
    assert done.exit_code == 1 and done.output.endswith("Aborted!\n")


def test_against_a_live_daemon_the_fast_path_and_click_agree(tmp_path: Path) -> None:
    """A real `corral serve`: submissions through both paths make the same jobs (their stored requests equal), `ps`
    prints the same table and JSON both ways, and errors (the daemon's and the client's) read the same."""
    import subprocess
    import sys

    from tests.api.test_serve import serving

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "CORRAL_SOCKET": str(tmp_path / "s"), "NO_COLOR": "1", "PYTHONPATH": str(root)}

    def corral(entry: str, *args: str) -> subprocess.CompletedProcess[str]:
        code = f"import sys\nfrom {entry} import main\nsys.argv[0] = 'corral'\nsys.exit(main())"
        return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=30)

    with serving(tmp_path / "s", tmp_path / "state") as (live, _):
        hog = live.submit("--gpus", "2", "--", "sleep", "600")  # holds both GPUs: the rest wait
        argv = ["--gpus", "1", "--name", "a b", "-t", "1:30:00", "--priority", "-5", "--", "python", "-c", "print(1)"]
        fast, slow = corral("corral.cli.fast", "submit", *argv), corral("corral.cli.main", "submit", *argv)
        assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
        jobs = live.jobs()
        a, b = jobs[fast.stdout.strip()], jobs[slow.stdout.strip()]
        for field in ("command", "name", "priority", "request", "state", "queue", "preemptible"):
            assert a[field] == b[field], field
        assert corral("corral.cli.fast", "ps", "--json").stdout == corral("corral.cli.main", "ps", "--json").stdout
        table = corral("corral.cli.fast", "ps", "-a")

        def timeless(text: str) -> list[list[str]]:  # "now", "3s ago": a second may pass between the two runs
            return [re.sub(r"\b(now|\d+[smhd] ago)\b", "T", line).split() for line in text.splitlines()]

        assert table.returncode == 0
        assert timeless(table.stdout) == timeless(corral("corral.cli.main", "ps", "-a").stdout)
        assert [line.split()[0] for line in table.stdout.splitlines()] == ["ID", "1", "2", "3"]
        for bad in (["submit", "--time-limit", "soon", "--", "true"], ["submit", "--gpus", "0.5", "--", "true"],
                    ["ps", "--state", "sleepy"], ["submit", "--bogus", "x"]):  # fmt: skip
            fast, slow = corral("corral.cli.fast", *bad), corral("corral.cli.main", *bad)
            assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), bad
            assert fast.returncode == 2 and fast.stderr
        live.run("cancel", hog)  # a daemon that stops leaves its jobs running
