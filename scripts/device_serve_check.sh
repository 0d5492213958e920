#!/usr/bin/env bash
# Real-GPU check of corral serve end to end: real NVML discovery, two half-GPU jobs (4 GiB each) under the MPS daemon
# that corral starts, one of them allocating past its grant, then a whole-GPU job. Run from the repository root on a
# GPU machine whose python3 has torch and httpx; fastapi, starlette, pydantic(-core), uvicorn, h11 and their needs
# travel as wheels installed into /tmp/site (see the device tool's README).
set -u
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/corral-serve-check}
STATE=$(mktemp -d)
export CORRAL_SOCKET=$STATE/corral.sock
corral() { python3 -m corral.cli.main "$@"; }
python3 - <<'PY' > "$STATE/jobs.py"
import re, pathlib
src = pathlib.Path("scripts/device_mps_check.py").read_text()
for name in ("INSIDE", "BEYOND", "WHOLE"):
    body = re.search(name + r' = """(.*?)"""', src, re.S).group(1)
    print(f"{name} = {body!r}")
PY
for name in INSIDE BEYOND WHOLE; do python3 -c "exec(open('$STATE/jobs.py').read()); open('$STATE/$name.py','w').write($name)"; done
python3 -m corral.cli.main serve --state-dir "$STATE" > "$OUT/serve.log" 2>&1 &
SERVE=$!
for i in $(seq 50); do [ -S "$CORRAL_SOCKET" ] && break; sleep 0.2; done
cat "$OUT/serve.log"
corral submit --name inside --gpu-fraction 0.5 --gpu-memory 4GiB -- python3 "$STATE/INSIDE.py"
corral submit --name beyond --gpu-fraction 0.5 --gpu-memory 4GiB -- python3 "$STATE/BEYOND.py"
corral submit --name whole --gpus 1 -- python3 "$STATE/WHOLE.py"
sleep 2; corral ps; corral explain 3
for i in $(seq 120); do
  n=$(corral ps --json | python3 -c "import json,sys; print(sum(j['state'] in ('succeeded','failed','cancelled','lost') for j in json.load(sys.stdin)))")
  [ "$n" = 3 ] && break; sleep 1
done
corral ps
for j in 1 2 3; do echo "== job $j"; corral logs $j; done
ls "$STATE/mps" 2>/dev/null && tail -3 "$STATE"/mps/*/log/control.log
kill -TERM $SERVE; wait $SERVE; echo "serve exit $?"
