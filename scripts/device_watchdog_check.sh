#!/usr/bin/env bash
# Real-GPU check of live GPU use in corral serve, without MPS (--sharing time-slicing):
#   1. two half-GPU jobs with 4 GiB grants; one allocates past its grant: the memory watchdog kills it (FAILED, with
#      the reason), the other runs on;
#   2. a process corral did not start holds 40 GiB: a whole-GPU job waits and `explain` names that process;
#      `corral gpus` shows its memory; once it exits, the whole-GPU job runs.
# Run from the repository root on a GPU machine whose python3 has torch and httpx; fastapi, starlette, pydantic(-core),
# uvicorn, h11 and their needs travel as wheels in .whl/ (see the device tool's README).
set -u
[ -d /tmp/site ] || pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/corral-watchdog-check}
mkdir -p "$OUT"
STATE=$(mktemp -d)
export CORRAL_SOCKET=$STATE/corral.sock
corral() { python3 -m corral.cli.main "$@"; }
state() { corral show "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['state'])"; }
wait_state() {  # job, wanted states (regex), seconds
  for _ in $(seq "$3"); do state "$1" | grep -Eq "^($2)$" && return 0; sleep 1; done; return 1
}
cat > "$STATE/steady.py" <<'PY'
import time, torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 15:
    a @ a; n += 1
torch.cuda.synchronize()
print(f"steady: 2 GiB held, {n / (time.time() - t):.1f} matmuls/s for 15 s, ran on after its neighbour was killed")
PY
cat > "$STATE/greedy.py" <<'PY'
import time, torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
print("greedy: 2 GiB, within its 4 GiB grant", flush=True)
time.sleep(3)
y = torch.empty(6 * 1024**3, dtype=torch.uint8, device="cuda")
print("greedy: 6 GiB more, past its grant; nothing stops the allocation without MPS", flush=True)
time.sleep(60)
print("greedy: NOT KILLED")
PY
cat > "$STATE/foreign.py" <<'PY'
import sys, time, torch
x = torch.empty(40 * 1024**3, dtype=torch.uint8, device="cuda")
open(sys.argv[1], "w").write("held")
time.sleep(120)
PY
cat > "$STATE/whole.py" <<'PY'
import torch
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")
print(f"whole GPU: 20 GiB allocated after the foreign process left; sees {torch.cuda.device_count()} GPU")
PY
python3 -m corral.cli.main serve --state-dir "$STATE" --sharing time-slicing --gpu-memory-watchdog kill \
  > "$OUT/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 100); do [ -S "$CORRAL_SOCKET" ] && break; sleep 0.2; done
head -2 "$OUT/serve.log"
echo "== 1. watchdog"
corral submit --name steady --gpu-fraction 0.5 --gpu-memory 4GiB -- python3 "$STATE/steady.py"
corral submit --name greedy --gpu-fraction 0.5 --gpu-memory 4GiB -- python3 "$STATE/greedy.py"
sleep 6
python3 - <<'PY'
from corral.gpu.metrics import NvmlSampler, attribute, read_process
s = NvmlSampler().sample()
for uuid, g in s.items():
    print("NVML sample", uuid, "used", g.used_mib, "MiB util", g.utilization_pct, "%")
    for p in g.processes or ():
        print("   pid", p.pid, p.used_mib, "MiB", read_process(p.pid))
PY
wait_state 2 "failed" 60 && echo "greedy ended: $(state 2)"
corral show 2 --json | python3 -c "import json,sys; j=json.load(sys.stdin); print('greedy reason:', j['reason'])"
echo "steady is $(state 1) after greedy's end"
wait_state 1 "succeeded|failed" 30
echo "== 2. foreign memory"
python3 "$STATE/foreign.py" "$STATE/held" & FOREIGN=$!
for _ in $(seq 60); do [ -f "$STATE/held" ] && break; sleep 0.5; done
echo "foreign pid $FOREIGN holds 40 GiB"
corral submit --name whole --gpus 1 -- python3 "$STATE/whole.py"
sleep 4
corral explain 3
corral gpus --json | python3 -c "import json,sys; [print('gpu', g['index'], 'used', g['used_memory_mib'], 'foreign', g['foreign_memory_mib'], 'held', g['held']) for g in json.load(sys.stdin)]"
kill $FOREIGN; wait $FOREIGN 2>/dev/null
wait_state 3 "succeeded|failed" 40
corral ps
for j in 1 2 3; do echo "== job $j log"; corral logs $j; done
kill -TERM $SERVE; wait $SERVE; echo "serve exit $?"
tail -5 "$OUT/serve.log"
