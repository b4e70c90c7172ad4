#!/usr/bin/env bash
# distdoctor's checks that need a real GPU (docs/gpu.md), as one script: a one-rank NCCL world on one GPU.
#   OUT=gpu-out bash scripts/gpu/check.sh      (python3 must hold torch built with CUDA; distdoctor from ./src)
#   ONLY="stall diagnose_text" TIMING=1 ...    runs only the steps named; TIMING=1 turns NCCL's collective timing on
# Each step prints "=== name rc=N seconds"; what the steps wrote lands in $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCH_NCCL_TRACE_BUFFER_SIZE=2000
DD="$PY -m distdoctor"

step() {  # step NAME LIMIT_S COMMAND...: run, keep its output in $OUT/NAME.txt, say how it went
    local name=$1 limit=$2 t0 rc
    shift 2
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0  # ONLY="stall diagnose_all": just those
    t0=$(date +%s%N)
    timeout -k 10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    rc=$?
    echo "=== $name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    tail -n "${TAIL:-25}" "$OUT/$name.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step env 60 $DD env
step check 240 $DD check --nproc 1 --backend nccl --format json
step validate 240 $DD validate --nproc 1 --backend nccl --sizes 1K,1M --no-subgroups
step bench 240 $DD bench --nproc 1 --backend nccl -b 1K -e 256M -f 4 -n 20 -w 5 -I
TAIL=40 step health 180 $PY -m distdoctor.health.demo --nproc 1 --backend nccl --steps 10 --every 5 --format json

# The GPU stall: distdoctor run must say "suspected" within 20 s of the stall, in diagnose's words.
rm -rf "$OUT/stall"
stall() {
    DISTDOCTOR_FR_JSON=1 TORCH_NCCL_ENABLE_TIMING=${TIMING:-0} $DD run --dump-dir "$OUT/stall" --suspect-floor 10 \
        --hang-timeout 40 --kill-on-hang -- $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
        scripts/gpu/stall_job.py 2>&1 |
        while IFS= read -r line; do printf '%.3f %s\n' "$(date +%s.%N)" "$line"; done
}
export -f stall
export OUT PY DD
TAIL=60 step stall 200 bash -c stall
$PY - "$OUT/stall.txt" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
stall = next((float(l.split()[2]) for l in lines if " STALL_AT " in l), None)
said = next((float(l.split()[0]) for l in lines if "HANG SUSPECTED" in l or "HANG CONFIRMED" in l), None)
words = [l for l in lines if "gpu_stopped" in l or "GPU stopped" in l]
print(f"stall at {stall}; verdict at {said}; after {None if stall is None or said is None else round(said - stall, 1)} s;"
      f" in diagnose's words: {bool(words)}")
PY
# That rank's real NCCL dumps, read by the loaders: every form alone, then together
ls -la "$OUT/stall" "$OUT/stall/.fr-json" 2>&1 | head -20
step diagnose_all 120 $DD diagnose "$OUT/stall" --world-size 1 --format json
step diagnose_text 120 $DD diagnose "$OUT/stall" --world-size 1
mkdir -p "$OUT/fr-pickle" && cp "$OUT"/stall/*fr* "$OUT/fr-pickle/" 2>/dev/null
step diagnose_fr_pickle 120 $DD diagnose "$OUT/fr-pickle" --world-size 1
step diagnose_fr_json 120 $DD diagnose "$OUT/stall/.fr-json" --world-size 1
$PY - "$OUT/stall" <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(os.path.join(sys.argv[1], ".fr-json", "*"))):
    d = json.load(open(p))
    print(p, "version", d.get("version"), "nccl", d.get("nccl_version") or d.get("comm_lib_version"),
          "pg_status", d.get("pg_status"), "entries", len(d.get("entries") or []),
          "states", [e.get("state") for e in (d.get("entries") or [])][-4:])
PY
# A CPU that stops outside collectives (its GPU idle, everything done): confirmed after the hang timeout, as
# cpu_stopped
cpu_stop() {
    MODE=cpu $DD run --dump-dir "$OUT/cpu" --hang-timeout 20 --kill-on-hang -- $PY -m torch.distributed.run \
        --standalone --nproc-per-node 1 scripts/gpu/stall_job.py 2>&1 |
        while IFS= read -r line; do printf '%.3f %s\n' "$(date +%s.%N)" "$line"; done
}
export -f cpu_stop
TAIL=30 step cpu_stop 150 bash -c cpu_stop
tar -czf "$OUT/stall-dumps.tgz" -C "$OUT" $(cd "$OUT" && ls -d stall cpu 2>/dev/null) && rm -rf "$OUT/stall" "$OUT/fr-pickle" "$OUT/cpu"
(cd "$OUT" && tar -czf logs.tgz ./*.txt && rm -f ./*.txt)  # what comes back: two archives
