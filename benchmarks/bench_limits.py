"""What the input limits cost a request (issue 12): `corral.api.limits.check_json` parses and walks every body before
any route sees it, and `check_admissible` checks a job's command, environment and text.

    python -m benchmarks.bench_limits [--repeat 20000]

Bodies: what `corral submit` sends (this process's environment), and a body just under the 1 MiB limit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from corral.api.limits import check_json
from corral.jobs.model import JobSpec, check_admissible
from corral.model.resources import Request


def per_call(fn: object, repeat: int) -> float:
    assert callable(fn)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20000)
    args = ap.parse_args()
    env = dict(os.environ)
    submit = {"command": ["python", "train.py", "--lr", "0.1"], "gpus": 1, "env": env, "cwd": "/"}
    small = json.dumps(submit).encode()
    big = json.dumps({"command": ["echo"], "env": {f"K{i}": "v" * 800 for i in range(1200)}}).encode()
    spec = JobSpec(("python", "train.py", "--lr", "0.1"), Request(cpu_milli=1000), "alice", 1000, 1000, env=env)
    t_small = per_call(lambda: check_json(small), args.repeat)
    t_big = per_call(lambda: check_json(big), max(1, args.repeat // 1000))
    t_spec = per_call(lambda: check_admissible(spec), args.repeat)
    print(f"check_json, a `corral submit` body ({len(small)} bytes, {len(env)} variables): {t_small * 1e6:.0f} us")
    print(f"check_json, a body of {len(big)} bytes (just under 1 MiB): {t_big * 1e3:.1f} ms")
    print(f"check_admissible, the same submission's spec: {t_spec * 1e6:.0f} us")


if __name__ == "__main__":
    main()
