"""The hostile-input corpus: what an attacker sends to every API of `corral serve` (issue 12, finding 5 and more).

Data only; `tests/api/test_hostile.py` drives it against a daemon it starts. Each API has a valid document (`TEMPLATES`)
and the places in it where a hostile value goes (`FIELDS`); every value of `VALUES` goes into every place, and every
body of `RAW_BODIES` is posted as is. `PATHS` are hostile URL paths, `RAW_REQUESTS` hostile bytes on the socket.
"""

from __future__ import annotations

from typing import Any

BIG = 2**63

#: Values that replace one field of a valid document (JSON-able; a lone surrogate travels as its JSON escape).
VALUES: list[Any] = [
    # numbers: huge, overflowing, negative, fractional where whole, not finite (as JSON can carry them)
    "99999999999999999999999999",
    99999999999999999999999999,
    10**400,
    BIG,
    -BIG,
    2**64,
    2**53 + 1,
    1e308,
    -1e308,
    5e-324,
    -1,
    0.5,
    1e9,
    10**9,
    # text: NUL, lone surrogates, control characters, markup, terminal escapes, paths, sizes
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "\ud83d",  # half an emoji
    "😀",  # a whole one (valid: must be accepted or refused cleanly, never garbled)
    "[/bold]",
    "[bold red]owned[/bold red]",
    ":skull:",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;pwned\x07",
    "\x1b[2J\x1b[H",
    "\r\nX-Injected: 1",
    "\u202etxt.exe",
    "../../etc/passwd",
    "/etc/passwd",
    "%00",
    "A=B",
    "x" * 300,
    "y" * (129 * 1024),
    "z" * (600 * 1024),
    "NaN",
    "Infinity",
    "1e999",
    # wrong types
    None,
    True,
    [],
    {},
    ["a"] * 5000,
    {"k": "v"},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
]

#: Bodies posted as bytes to each API's create route.
RAW_BODIES: list[bytes] = [
    b"",
    b"{",
    b"{bad",
    b"null",
    b"[]",
    b'"string"',
    b"1",
    b"NaN",
    b'{"cpus": NaN}',
    b'{"cpus": Infinity}',
    b'{"cpus": -Infinity}',
    b'{"cpus": 1e999}',
    b'{"cpus": 99999999999999999999999999999999999999}',
    b'{"x": 1' + b"0" * 5000 + b"}",  # an integer of 5001 digits (past Python's int-string limit)
    b"[" * 10_000 + b"]" * 10_000,
    b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    b"[" * 100_000,
    b'{"a": "\xff\xfe"}',
    b'{"a": "\xed\xa0\x80"}',
    b'{"a": "\xc0\xaf"}',
    b"\xef\xbb\xbf{}",
    b'{"a": "\\ud800"}',
    b'{"a\\u0000": 1}',
    b'{"a": "b\\u0000"}',
    b"\x00" * 100,
    b"\xff" * 100,
    b" " * (2 * 1024 * 1024),
    b'{"a": "' + b"x" * (1100 * 1024) + b'"}',
    b'{"a": 1, "a": 2}',
]

#: A valid document per create route, with `cmd` that ends at once and nothing that launches by itself.
TEMPLATES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "corral": (
        "POST",
        "/v1/jobs",
        {"command": ["true"], "cpus": "100m", "memory": "16MiB", "name": "hostile", "env": {"K": "v"}},
    ),
    "definitions": (
        "POST",
        "/v1/definitions",
        {"id": "hostile", "run": {"cmd": "true", "cpus": 0.1, "mem": 32, "disk": 0}},
    ),
    "metronome": (
        "POST",
        "/metronome/v1/jobs",
        {"id": "hostile", "run": {"cmd": "true", "cpus": 0.1, "mem": 32, "disk": 0, "env": {"K": "v"}}},
    ),
    "chronos": (
        "POST",
        "/chronos/v1/scheduler/iso8601",
        {
            "name": "hostile",
            "command": "true",
            "schedule": "R1/2099-01-01T00:00:00Z/PT24H",
            "cpus": 0.1,
            "mem": 32,
            "environmentVariables": [{"name": "K", "value": "v"}],
        },
    ),
    "marathon": (
        "POST",
        "/marathon/v2/apps",
        {"id": "/hostile", "cmd": "sleep 600", "instances": 0, "cpus": 0.1, "mem": 32, "env": {"K": "v"}},
    ),
}

#: Where a value goes: a path of keys/indices into the template (a new key is added; "*KEY" replaces a dict key).
FIELDS: dict[str, list[tuple[str | int, ...]]] = {
    "corral": [
        ("command",),
        ("command", 0),
        ("command", 1),
        ("name",),
        ("cpus",),
        ("memory",),
        ("gpus",),
        ("gpu_fraction",),
        ("gpu_memory",),
        ("gpu_model",),
        ("priority",),
        ("retries",),
        ("time_limit",),
        ("env",),
        ("env", "K"),
        ("env", "*K"),
        ("cwd",),
        ("idempotency_key",),
    ],
    "definitions": [("id",), ("run", "cmd"), ("run", "cpus"), ("run", "mem")],
    "metronome": [
        ("id",),
        ("description",),
        ("labels",),
        ("run", "cmd"),
        ("run", "args"),
        ("run", "cpus"),
        ("run", "mem"),
        ("run", "disk"),
        ("run", "gpus"),
        ("run", "env"),
        ("run", "env", "K"),
        ("run", "env", "*K"),
        ("run", "maxLaunchDelay"),
        ("run", "taskKillGracePeriodSeconds"),
        ("run", "restart"),
        ("run", "user"),
    ],
    "chronos": [
        ("name",),
        ("command",),
        ("arguments",),
        ("shell",),
        ("cpus",),
        ("mem",),
        ("disk",),
        ("gpus",),
        ("retries",),
        ("epsilon",),
        ("environmentVariables",),
        ("environmentVariables", 0, "name"),
        ("environmentVariables", 0, "value"),
        ("maxCompletionTime",),
        ("description",),
        ("owner",),
        ("runAsUser",),
    ],
    "marathon": [
        ("id",),
        ("cmd",),
        ("args",),
        ("instances",),
        ("cpus",),
        ("mem",),
        ("disk",),
        ("gpus",),
        ("env",),
        ("env", "K"),
        ("env", "*K"),
        ("labels",),
        ("backoffSeconds",),
        ("backoffFactor",),
        ("maxLaunchDelaySeconds",),
        ("taskKillGracePeriodSeconds",),
        ("healthChecks",),
        ("constraints",),
        ("portDefinitions",),
        ("user",),
    ],
}

#: Updates of an existing object (created from the template first): the value goes into a small partial document.
UPDATES: dict[str, tuple[str, str, dict[str, Any], list[tuple[str | int, ...]]]] = {
    "marathon": (
        "PUT",
        "/marathon/v2/apps/hostile",
        {"cmd": "sleep 600"},
        [("instances",), ("cmd",), ("cpus",), ("env",), ("args",)],
    ),
    "metronome": (
        "PUT",
        "/metronome/v1/jobs/hostile",
        {"id": "hostile", "run": {"cmd": "true", "cpus": 0.1, "mem": 32, "disk": 0}},
        [("run", "cmd"), ("run", "mem"), ("run", "env"), ("description",)],
    ),
}

#: Hostile URL paths (already percent-encoded where it matters), sent with GET and with a method the route lacks.
PATHS: list[str] = [
    "/",
    "/nope",
    "/v1/jobs/%00",
    "/v1/jobs/%ff",
    "/v1/jobs/..%2f..%2fetc%2fpasswd",
    "/v1/jobs/99999999999999999999999999",
    "/v1/jobs/-1",
    "/v1/jobs/1/logs?offset=9223372036854775808",
    "/v1/jobs/1/logs?offset=-1",
    "/v1/jobs/1/logs?offset=1e3",
    "/v1/jobs?all=maybe",
    "/v1/definitions/%00",
    "/v1/definitions/" + "x" * 5000,
    "/metronome/v1/jobs/%00",
    "/metronome/v1/jobs/%ed%a0%80",
    "/metronome/v1/jobs/a/runs/%00",
    "/metronome/v1/jobs?embed=%00",
    "/metronome/nope",
    "/chronos/v1/scheduler/jobs/search?name=%00",
    "/chronos/v1/scheduler/nope",
    "/marathon/v2/apps/%00",
    "/marathon/v2/apps/..%2f..",
    "/marathon/v2/apps/" + "a/" * 2000,
    "/marathon/nope",
]

#: Bytes written straight to the daemon's socket (a request no client library would send). They name the CLI's Host,
#: so that each reaches what it is meant to try rather than the socket's Host rule (corral.api.hosts).
RAW_REQUESTS: list[bytes] = [
    b"GET /v1/jobs HTTP/1.1\r\nHost: corral\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n",
    b"GET /v1/jobs HTTP/1.1\r\nHost: corral\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(5000)) + b"\r\n",
    b"GET /v1/jobs/\xff\xfe HTTP/1.1\r\nHost: corral\r\n\r\n",
    b"GET /v1/jobs/\x00 HTTP/1.1\r\nHost: corral\r\n\r\n",
    b"POST /v1/jobs HTTP/1.1\r\nHost: corral\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"POST /v1/jobs HTTP/1.1\r\nHost: corral\r\nContent-Length: -5\r\n\r\n",
    b"POST /v1/jobs HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"100000\r\n"
    + b"[" * 0x100000
    + b"\r\n0\r\n\r\n",
    b"BREW /v1/jobs HTTP/1.1\r\nHost: corral\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain socket
    b"\r\n\r\n\r\n",
]

#: Hostile queues files (issue 23): written to the daemon's queues file, then `POST /v1/queues/reload` as root; each
#: must be a 4xx naming the bound, fast, with the old configuration kept.
QUEUE_FILES: list[str] = [
    "a = " + "[" * 100_000 + "]" * 100_000 + "\n",  # was a 500 (RecursionError)
    "a = " + "{b = " * 5_000 + "1" + "}" * 5_000 + "\n",
    "a" + ".a" * 100_000 + " = 1\n",
    "".join(f"[queues.q{i}]\n" for i in range(200_000)),  # took over 15 s
    "[queues.a]\n" + "".join(f"[queues.a.users.u{i}]\n" for i in range(20_000)),
    "".join(f"[q{i}]\n" for i in range(60_000)),
    "admins = [" + '"a",' * 20_000 + "]\n",
    '"\\ud800" = 1\n',
    "\x00 = 1\n",
]
