#!/usr/bin/env bash
# Scale from zero on a real NVIDIA GPU, end to end:
#   warmgate (process backend) -> the demo engine with --device cuda and a multi-GiB checkpoint.
# One request wakes the cold target; the script reports the cold-start time and the VRAM the
# engine holds while ready, waits for warmgate's idle release (idle_after) and checks that the
# VRAM went back to (near) its baseline. Two cycles: the first also creates the checkpoint file
# and initialises CUDA; the second is a plain cold start.
#
# Then the parked tier (docs/pools.md): a second target, engine comfyui, with a
# PARK_CHECKPOINT_SIZE (8 GiB) checkpoint and a one-step warm-up workflow (ready means resident
# and rendered once, after a cold start and after a wake alike), park_after PARK_AFTER: the VRAM
# the engine holds ready, parked (POST /free: the checkpoint waits in pinned host memory) and
# cold, and the seconds of a wake from parked against a cold start, PARK_ROUNDS of each. Goals:
# parked holds <= PARKED_LIMIT_MIB (1 GiB) over the baseline, a wake <= WAKE_LIMIT (1.5 s).
#
#   loadtests/gpu_check.sh                 # defaults below
#   CHECKPOINT_SIZE=8GiB IDLE_AFTER=30s loadtests/gpu_check.sh
#   PARK_ROUNDS=5 loadtests/gpu_check.sh   # more wakes and cold starts for the medians
#   DEVICE=cpu ...                         # a dry run of the script itself (no CUDA checks)
#
# Needs: nvidia-smi, python3 >= 3.11. Bootstraps .venv when missing (with system site packages,
# so a preinstalled CUDA torch is used as is) and installs torch only if it is not importable;
# a machine without internet gets a clear message instead. Summary: $OUT/gpu-check.txt when $OUT
# is set, else loadtests/results/gpu-check-<UTC>.txt; exit status 0 only when every check passed.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
CHECKPOINT_SIZE=${CHECKPOINT_SIZE:-4GiB}
IDLE_AFTER=${IDLE_AFTER:-20s}
GPU_INDEX=${GPU_INDEX:-0}
DEVICE=${DEVICE:-cuda}
RELEASE_TOLERANCE_MIB=${RELEASE_TOLERANCE_MIB:-512}
COLD_START_LIMIT=${COLD_START_LIMIT:-600}
PARK_CHECKPOINT_SIZE=${PARK_CHECKPOINT_SIZE:-8GiB}
PARK_AFTER=${PARK_AFTER:-5s}
PARK_IDLE_AFTER=${PARK_IDLE_AFTER:-30s}
PARK_ROUNDS=${PARK_ROUNDS:-3}
PARKED_LIMIT_MIB=${PARKED_LIMIT_MIB:-1024}
WAKE_LIMIT=${WAKE_LIMIT:-1.5}
UTC=$(date -u +%Y%m%dT%H%M%SZ)
if [ -n "${OUT:-}" ]; then
    RESULTS=$OUT
    SUMMARY=$OUT/gpu-check.txt
else
    RESULTS=$ROOT/loadtests/results
    SUMMARY=$RESULTS/gpu-check-$UTC.txt
fi
mkdir -p "$RESULTS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/warmgate-gpu-check.XXXXXX")
WARMGATE_PID=""
: >"$SUMMARY"

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
die() {
    say "result: FAIL ($*)"
    log "summary written to $SUMMARY"
    exit 1
}

cleanup() {
    if [ -n "$WARMGATE_PID" ] && kill -0 "$WARMGATE_PID" 2>/dev/null; then
        kill -TERM "$WARMGATE_PID" 2>/dev/null || true # warmgate stops its engine child itself
        for _ in $(seq 1 60); do
            kill -0 "$WARMGATE_PID" 2>/dev/null || break
            sleep 0.5
        done
        kill -KILL "$WARMGATE_PID" 2>/dev/null || true
    fi
    if [ -f "$WORK/warmgate.log" ]; then
        cp "$WORK/warmgate.log" "$RESULTS/gpu-check-warmgate.log" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "warmgate GPU check $UTC on $(hostname)"
say "checkpoint $CHECKPOINT_SIZE, idle_after $IDLE_AFTER, GPU index $GPU_INDEX, device $DEVICE"

# ---------------------------------------------------------------- the GPU
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver here"
gpu_name=$(nvidia-smi --id="$GPU_INDEX" --query-gpu=name,memory.total --format=csv,noheader) ||
    die "nvidia-smi cannot query GPU $GPU_INDEX"
say "gpu: $gpu_name"

vram_used() { # MiB in use on the GPU, all processes
    nvidia-smi --id="$GPU_INDEX" --query-gpu=memory.used --format=csv,noheader,nounits |
        tr -d ' '
}

# ---------------------------------------------------------------- python, venv, torch
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    log "bootstrapping .venv (with system site packages)"
    "$PY" -m venv --system-site-packages .venv || die "cannot create .venv with $PY"
    if ! .venv/bin/python -m pip install -q -e . >"$WORK/pip.log" 2>&1; then
        log "pip install -e . failed (no internet?); using what the system already has"
        tail -n 5 "$WORK/pip.log" >&2 || true
    fi
fi
VPY=$ROOT/.venv/bin/python
if [ ! -f router/cluster/keda_proto/externalscaler_pb2.py ]; then # git-ignored build output
    log "generating router/cluster/keda_proto's gRPC modules (what 'pip install -e .' would)"
    "$VPY" -m grpc_tools.protoc --proto_path=. --python_out=. --pyi_out=. --grpc_python_out=. \
        router/cluster/keda_proto/externalscaler.proto 2>"$WORK/protoc.log" ||
        die "router/cluster/keda_proto/*_pb2*.py are missing and grpcio-tools cannot make them:" \
            "$(tail -n 1 "$WORK/protoc.log") (run 'make install' where PyPI is reachable)"
fi
if ! "$VPY" -c "import router.server, backends.demo_engine" 2>"$WORK/import.log"; then
    die "warmgate cannot be imported here: $(tail -n 1 "$WORK/import.log");" \
        "run 'make install' on a machine with PyPI access, or provide a wheelhouse (PIP_FIND_LINKS)"
fi
if [ "$DEVICE" = cuda ]; then
    if ! "$VPY" -c "import torch" 2>/dev/null; then
        log "torch is not importable: pip install torch"
        if ! "$VPY" -m pip install -q torch >"$WORK/pip-torch.log" 2>&1; then
            tail -n 5 "$WORK/pip-torch.log" >&2 || true
            die "torch is not installed and could not be (no internet on this machine?):" \
                "install a CUDA build of torch into .venv or the system python, then rerun"
        fi
    fi
    cuda=$("$VPY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())") ||
        die "importing torch failed"
    say "torch: $cuda"
    case "$cuda" in
    *True) ;;
    *) die "torch.cuda.is_available() is False (a CPU-only torch build, or no GPU visible)" ;;
    esac
fi

# ---------------------------------------------------------------- warmgate + the demo engine
read -r PORT ADMIN < <("$VPY" -c "
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))
")
CKPT=$WORK/demo-checkpoint-$CHECKPOINT_SIZE.bin
PARK_CKPT=$WORK/demo-checkpoint-park-$PARK_CHECKPOINT_SIZE.bin
cat >"$WORK/warmup.json" <<'EOF'
{"3": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 1, "model": ["4", 0],
       "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["5", 0]}},
 "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "demo"}},
 "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
 "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "warm-up", "clip": ["4", 1]}},
 "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
 "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "w", "images": ["8", 0]}}}
EOF
cat >"$WORK/warmgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
admin_listen: 127.0.0.1:$ADMIN
server: {access_log: true}
targets:
  gpu:
    engine: http
    routes: [{path_prefix: /}]
    backend:
      kind: process
      command: ["$VPY", -m, backends.demo_engine, --port, "{port}", --device, "$DEVICE",
                --checkpoint-size, "$CHECKPOINT_SIZE", --checkpoint, "$CKPT"]
      cwd: "$ROOT"
      env: {EAGER_LOAD_MODEL: "1", CUDA_DEVICE_ORDER: PCI_BUS_ID, CUDA_VISIBLE_DEVICES: "$GPU_INDEX"}
      stop_grace: 30s
    readiness: {path: /readyz, interval: 100ms}
    scaling: {idle_after: $IDLE_AFTER, cold_start_timeout: ${COLD_START_LIMIT}s}
  park:
    engine: comfyui
    warmup_workflow: "$WORK/warmup.json"
    routes: [{path_prefix: /park, strip_prefix: true}]
    backend:
      kind: process
      command: ["$VPY", -m, backends.demo_engine, --port, "{port}", --device, "$DEVICE",
                --checkpoint-size, "$PARK_CHECKPOINT_SIZE", --checkpoint, "$PARK_CKPT",
                --render-seconds, "0"]
      cwd: "$ROOT"
      env: {EAGER_LOAD_MODEL: "1", CUDA_DEVICE_ORDER: PCI_BUS_ID, CUDA_VISIBLE_DEVICES: "$GPU_INDEX"}
      stop_grace: 30s
    readiness: {path: /readyz, interval: 50ms}
    scaling: {park_after: $PARK_AFTER, idle_after: $PARK_IDLE_AFTER,
              cold_start_timeout: ${COLD_START_LIMIT}s, busy_poll: 500ms}
EOF

"$VPY" -m router check --config "$WORK/warmgate.yaml" >/dev/null || die "warmgate rejected its config"
"$VPY" -m router serve --config "$WORK/warmgate.yaml" >"$WORK/warmgate.log" 2>&1 &
WARMGATE_PID=$!

http() { # http PORT PATH [TIMEOUT] -> "status seconds cold_start_header"
    "$VPY" - "$@" <<'EOF'
import sys, time, urllib.error, urllib.request
port, path = sys.argv[1], sys.argv[2]
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 10
t0 = time.monotonic()
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        r.read()
        status, cold = r.status, r.headers.get("X-Warmgate-Cold-Start", "-")
except urllib.error.HTTPError as e:
    status, cold = e.code, "-"
except OSError as e:
    status, cold = 0, "-"
print(status, f"{time.monotonic() - t0:.3f}", cold)
EOF
}

phase() { # phase [TARGET]: its phase from warmgate's admin listener (parking, waking apart)
    "$VPY" - "$ADMIN" "${1:-gpu}" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/targets", timeout=5) as r:
        t = json.load(r)[sys.argv[2]]
    p = t["phase"]
    if p == "parked" and t.get("parking"):
        p = "parking"
    elif p == "parked" and t.get("waking"):
        p = "waking"
    print(p)
except OSError:
    print("unreachable")
EOF
}

for _ in $(seq 1 100); do
    [ "$(http "$ADMIN" /healthz 2 | cut -d' ' -f1)" = 200 ] && break
    kill -0 "$WARMGATE_PID" 2>/dev/null || die "warmgate exited: $(tail -n 20 "$WORK/warmgate.log")"
    sleep 0.2
done
[ "$(phase)" = cold ] || die "target not cold at start (phase $(phase))"

idle_seconds=$("$VPY" -c "
import sys
sys.path.insert(0, '$ROOT')
from backends.units import parse_duration
print(int(parse_duration('$IDLE_AFTER')) + 1)
")

checks_failed=0
check() { # check NAME CONDITION-EXIT-STATUS
    if [ "$2" = 0 ]; then say "  ok   $1"; else
        say "  FAIL $1"
        checks_failed=$((checks_failed + 1))
    fi
}

cycle() { # one cold start, the VRAM it holds, and its idle release
    local n=$1 baseline answer status total cold ready_mib released_mib deadline t
    baseline=$(vram_used)
    log "cycle $n: baseline VRAM ${baseline} MiB; waking the target"
    answer=$(http "$PORT" /system_stats "$COLD_START_LIMIT")
    read -r status total cold <<<"$answer"
    [ "$status" = 200 ] || die "cycle $n: the waking request got HTTP $status ($(tail -n 20 "$WORK/warmgate.log"))"
    sleep 1
    ready_mib=$(vram_used)
    log "cycle $n: ready after ${total}s (warmgate held it ${cold}s); VRAM ${ready_mib} MiB"
    deadline=$(($(date +%s) + idle_seconds + 120))
    while [ "$(phase)" != cold ]; do
        [ "$(date +%s)" -lt "$deadline" ] || die "cycle $n: no idle release within idle_after + 120s"
        sleep 1
    done
    released_mib=$(vram_used)
    for t in $(seq 1 30); do # the driver frees the context just after the process exits
        [ "$released_mib" -le $((baseline + RELEASE_TOLERANCE_MIB)) ] && break
        sleep 1
        released_mib=$(vram_used)
        : "$t"
    done
    say "cycle $n: cold start ${total}s (held ${cold}s in warmgate), VRAM baseline ${baseline} MiB," \
        "ready ${ready_mib} MiB (+$((ready_mib - baseline))), after idle release ${released_mib} MiB"
    local size_mib
    size_mib=$("$VPY" -c "
import sys
sys.path.insert(0, '$ROOT')
from backends.demo_engine.config import parse_size
print(parse_size('$CHECKPOINT_SIZE') // 2**20)
")
    [ "$((ready_mib - baseline))" -ge "$((size_mib * 9 / 10))" ]
    check "cycle $n: the checkpoint is resident in VRAM while ready (>= 90% of ${size_mib} MiB)" $?
    [ "$released_mib" -le "$((baseline + RELEASE_TOLERANCE_MIB))" ]
    check "cycle $n: VRAM back within ${RELEASE_TOLERANCE_MIB} MiB of baseline after idle release" $?
}

wait_phase() { # wait_phase TARGET PHASE SECONDS
    local deadline=$(($(date +%s) + $3))
    while [ "$(phase "$1")" != "$2" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

settled_vram() { # VRAM once the driver has settled (it frees a context just after an exit)
    local before now
    before=$(vram_used)
    now=$before
    for _ in $(seq 1 10); do
        sleep 1
        now=$(vram_used)
        [ "$now" = "$before" ] && break
        before=$now
    done
    echo "$now"
}

median() { "$VPY" -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.3f}')" "$@"; }

park_cycle() { # the parked tier: VRAM ready, parked and cold; wakes against cold starts
    local baseline answer status took held ready_mib=0 parked_mib=0 cold_mib=0 i wake cold
    local seconds park_seconds idle_seconds wakes=() colds=()
    seconds=$("$VPY" -c "
import sys
sys.path.insert(0, '$ROOT')
from backends.units import parse_duration
print(int(parse_duration('$PARK_AFTER')) + 1, int(parse_duration('$PARK_IDLE_AFTER')) + 1)
")
    read -r park_seconds idle_seconds <<<"$seconds"
    baseline=$(settled_vram)
    log "park: baseline VRAM ${baseline} MiB; first start of the $PARK_CHECKPOINT_SIZE target"
    answer=$(http "$PORT" /park/ "$COLD_START_LIMIT") # creates the file, initialises CUDA
    read -r status took held <<<"$answer"
    [ "$status" = 200 ] || die "park: the first start got HTTP $status"
    for i in $(seq 1 "$PARK_ROUNDS"); do
        sleep 1
        ready_mib=$(vram_used)
        wait_phase park parked $((park_seconds + 120)) || die "park: not parked after park_after"
        parked_mib=$(settled_vram)
        answer=$(http "$PORT" /park/ "$COLD_START_LIMIT")
        read -r status took held <<<"$answer"
        [ "$status" = 200 ] || die "park: the wake got HTTP $status"
        wakes+=("$took")
        log "park round $i: ready ${ready_mib} MiB, parked ${parked_mib} MiB, wake ${took}s"
        wait_phase park cold $((idle_seconds + 180)) || die "park: not stopped after idle_after"
        cold_mib=$(settled_vram)
        answer=$(http "$PORT" /park/ "$COLD_START_LIMIT")
        read -r status took held <<<"$answer"
        [ "$status" = 200 ] || die "park: the cold start got HTTP $status"
        colds+=("$took")
        log "park round $i: cold ${cold_mib} MiB, cold start ${took}s"
    done
    wake=$(median "${wakes[@]}")
    cold=$(median "${colds[@]}")
    say "park: $PARK_CHECKPOINT_SIZE checkpoint, VRAM baseline ${baseline} MiB, ready ${ready_mib}" \
        "MiB (+$((ready_mib - baseline))), parked ${parked_mib} MiB (+$((parked_mib - baseline)))," \
        "cold ${cold_mib} MiB (+$((cold_mib - baseline)))"
    say "park: wake from parked ${wake}s, cold start ${cold}s (medians of $PARK_ROUNDS; wakes" \
        "${wakes[*]}; cold starts ${colds[*]})"
    local size_mib
    size_mib=$("$VPY" -c "
import sys
sys.path.insert(0, '$ROOT')
from backends.demo_engine.config import parse_size
print(parse_size('$PARK_CHECKPOINT_SIZE') // 2**20)
")
    [ "$((ready_mib - baseline))" -ge "$((size_mib * 9 / 10))" ]
    check "ready: the checkpoint is resident in VRAM (>= 90% of ${size_mib} MiB)" $?
    [ "$((parked_mib - baseline))" -le "$PARKED_LIMIT_MIB" ]
    check "parked: the engine holds <= ${PARKED_LIMIT_MIB} MiB over the baseline" $?
    "$VPY" -c "import sys; sys.exit(0 if float('$wake') <= float('$WAKE_LIMIT') else 1)"
    check "a wake from parked takes <= ${WAKE_LIMIT}s (median)" $?
    [ "$((cold_mib - baseline))" -le "$RELEASE_TOLERANCE_MIB" ]
    check "stopped after idle_after: VRAM within ${RELEASE_TOLERANCE_MIB} MiB of baseline" $?
}

set +e # a failed check is counted, not fatal
cycle 1 # also creates the checkpoint file and initialises CUDA
cycle 2 # a plain cold start from the page cache
park_cycle
set -e

if [ "$checks_failed" = 0 ]; then say "result: PASS"; else say "result: FAIL ($checks_failed checks)"; fi
log "summary written to $SUMMARY"
[ "$checks_failed" = 0 ]
