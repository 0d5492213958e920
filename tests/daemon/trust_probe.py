"""What a local user can do to, and learn from, a root `corral serve`: run AS that user by the real-user tests.

    python trust_probe.py SOCKET post  BODY_JSON          -> {"status", "body"} (one POST: {"url", "json"})
    python trust_probe.py SOCKET snoop PLAN_JSON          -> everything this user could read, as one JSON report

Standard library only (it starts fast and needs nothing of corral). The report holds every byte the user got back, so
the test can search it for another user's secrets; "denied" / "missing" record what the system refused.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import sys
from typing import Any


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("corral", timeout=20)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(20)
        sock.connect(self.unix_path)
        self.sock = sock


def request(sock: str, method: str, url: str, body: Any = None) -> tuple[int, str]:
    conn = _UnixHTTP(sock)
    payload = None if body is None else json.dumps(body)
    conn.request(method, url, body=payload, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read().decode("utf-8", "replace")


def read(path: str) -> str:
    """A file's text, a folder's listing, or why not."""
    try:
        if os.path.isdir(path):
            return "listing:" + ",".join(sorted(os.listdir(path)))
        with open(path, "rb") as f:
            return "read:" + f.read().decode("latin-1")
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "missing"


def query(db: str) -> str:
    """What `sqlite3 "file:DB?mode=ro"` shows this user (the way the token was stolen in issue 12)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return "rows:" + json.dumps(conn.execute("SELECT * FROM jobs").fetchall())
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"error:{exc}"


def processes() -> dict[str, Any]:
    """Every process's command line, and the environment of every process of another user that could be read."""
    me = os.getuid()
    cmdlines, foreign_environ = [], {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdlines.append(f.read().replace(b"\0", b" ").decode("latin-1"))
            if os.stat(f"/proc/{entry}").st_uid != me:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    foreign_environ[entry] = f.read().decode("latin-1")
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
    return {"cmdlines": cmdlines, "foreign_environ": foreign_environ}


def snoop(sock: str, plan: dict[str, Any]) -> dict[str, Any]:
    http = {}
    for url in plan["urls"]:
        try:
            http[url] = list(request(sock, "GET", url))
        except OSError as exc:
            http[url] = [0, f"error:{exc}"]
    return {
        "uid": os.getuid(),
        "http": http,
        "files": {path: read(path) for path in plan["files"]},
        "sqlite": query(plan["db"]),
        "proc": processes(),
        "daemon_environ": read(f"/proc/{plan['daemon_pid']}/environ"),
    }


def main() -> None:
    sock, mode, arg = sys.argv[1:4]
    if mode == "post":
        spec = json.loads(arg)
        status, body = request(sock, "POST", spec["url"], spec["json"])
        out: Any = {"status": status, "body": json.loads(body) if body.strip() else None}
    else:
        out = snoop(sock, json.loads(arg))
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
