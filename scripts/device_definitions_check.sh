#!/usr/bin/env bash
# Real-GPU check of job definitions and services in corral serve: a Metronome job asking for `gpus: 1` and a
# Marathon app asking for `gpus: 1`, both on the real GPU found by NVML, through corral's Metronome and Marathon APIs.
# Run from the repository root on a GPU machine whose python3 has torch and httpx; fastapi, starlette, pydantic(-core),
# uvicorn, h11, tzdata and their needs travel as wheels in .whl/ (see the device tool's README).
set -u
[ -d /tmp/site ] || pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/corral-definitions-check}
mkdir -p "$OUT"
STATE=$(mktemp -d)
export CORRAL_SOCKET=$STATE/corral.sock
corral() { python3 -m corral.cli.main "$@"; }
cat > "$STATE/train.py" <<'PY'
import os, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 3:
    a @ a; n += 1
torch.cuda.synchronize()
print(f"metronome run on {torch.cuda.get_device_name(0)} ({os.environ['CUDA_VISIBLE_DEVICES']}), "
      f"{n / (time.time() - t):.1f} bf16 8192^2 matmuls/s")
PY
cat > "$STATE/serve_gpu.py" <<'PY'
import http.server, os, torch
x = torch.ones(1024, 1024, device="cuda")
name = torch.cuda.get_device_name(0)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{name} {os.environ['CUDA_VISIBLE_DEVICES']} sum={x.sum().item():.0f}\n".encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT0"])), H).serve_forever()
PY
python3 -m corral.cli.main serve --state-dir "$STATE" > "$OUT/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 100); do [ -S "$CORRAL_SOCKET" ] && break; sleep 0.2; done
head -1 "$OUT/serve.log"
cat > "$STATE/job.json" <<EOF2
{"id": "gpu.train", "run": {"cmd": "python3 $STATE/train.py", "cpus": 2, "mem": 4096, "disk": 0, "gpus": 1}}
EOF2
cat > "$STATE/app.json" <<EOF2
{"id": "/gpu-web", "cmd": "python3 $STATE/serve_gpu.py", "cpus": 1, "mem": 2048, "gpus": 1, "instances": 1,
 "healthChecks": [{"protocol": "HTTP", "path": "/", "portIndex": 0, "gracePeriodSeconds": 60,
                   "intervalSeconds": 2, "timeoutSeconds": 1}]}
EOF2
echo "== Metronome job, gpus: 1"
corral job create -f "$STATE/job.json"
corral job run gpu.train
for _ in $(seq 60); do corral job runs gpu.train --json | grep -q '"SUCCESS"\|"FAILED"' && break; sleep 1; done
corral job runs gpu.train
corral logs 1
echo "== Marathon app, gpus: 1"
corral app create -f "$STATE/app.json"
for _ in $(seq 90); do
  corral app show /gpu-web --json | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin)['tasksHealthy'] else 1)" && break
  sleep 1
done
corral app show /gpu-web
PORT=$(corral app show /gpu-web --json | python3 -c "import json,sys; d=json.load(sys.stdin); t=[t for t in d.get('tasks', d.get('instances', [])) if t.get('ports')]; print(t[0]['ports'][0] if t else '')")
[ -n "$PORT" ] && python3 -c "import urllib.request; print('GET /:', urllib.request.urlopen('http://127.0.0.1:$PORT/').read().decode().strip())"
corral gpus
corral app delete /gpu-web
sleep 2; corral ps
kill -TERM $SERVE; wait $SERVE; echo "serve exit $?"
