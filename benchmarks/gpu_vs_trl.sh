#!/usr/bin/env bash
# Issue 38 on a lent GPU, in one run (about 9.5 minutes on an H100/H200; `make bench-gpu`): rloo against TRL 1.16's
# RLOOTrainer phase by phase on a random model of Qwen2.5-0.5B's shape (benchmarks/gpu_vs_trl.py), a fixed-length
# and a varied-length case, a reduced profile of each implementation's last fixed batch; A/B toggles of cuDNN
# attention for rloo; the H200 bf16 repro of async_overlap.py with and without cuDNN attention; last, rloo with
# its captured decode step and fused LM head (both opt-in until a GPU has run them), and rloo and TRL each with
# transformers' continuous batching.
# Each part has its own time limit, cut to what is left of TOTAL seconds (570), so a part that hangs or runs long
# leaves the others' numbers; every part writes its JSON as it goes. The last lines printed are the tables
# (benchmarks/gpu_report.py). Results: $OUT (or ./gpu-out), at most 8 files.
#   bash benchmarks/gpu_vs_trl.sh          # on the GPU machine, from the repository root, .whl/ carried along
#   QUICK=1 bash benchmarks/gpu_vs_trl.sh  # a tiny model on any machine, seconds a part: a dry run of the script
#   PARTS="rloo-fixed trl-fixed" ...       # only these parts (setup and the report always run)
# TRL and what it needs that the GPU machine's Python may lack travel as wheels in .whl/ (benchmarks/gpu_wheels.sh
# fills it); they are installed into /tmp/pyx, TRL always, the others only where they do not import.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -z "${QUICK:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
    wheels=()
    for wheel in .whl/*.whl; do
        module=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
        if [ "$module" = trl ] || ! $PY -c "import $module" 2>/dev/null; then wheels+=("$wheel"); fi
    done
    echo "installing into /tmp/pyx: ${wheels[*]:-nothing}" >>"$OUT/log.txt"  # the machine line comes first
    [ ${#wheels[@]} -gt 0 ] && $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/pyx \
        "${wheels[@]}" >>"$OUT/log.txt" 2>&1
    PYTHONPATH=/tmp/pyx${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
TOTAL=${TOTAL:-570}  # since the script started (wheels installed): within run's 600 s with the report
MODELS=$(mktemp -d /tmp/gpu-vs-trl.XXXXXX)
trap 'rm -rf "$MODELS"' EXIT
if [ -n "${QUICK:-}" ]; then  # one thread each: a tiny model's two threads spin on a shared core
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    SETUP=(--quick) BATCHES=2 REPRO=(--steps 2 --hidden 64 --layers 2 --tokens 8)
else
    SETUP=() BATCHES=3 REPRO=(--steps 4 --hidden 1024 --layers 8 --tokens 256)
fi
part() {  # part NAME SECONDS COMMAND...: run it within min(SECONDS, what is left), its output into $OUT/log.txt
    local name=$1 limit=$2 left=$((TOTAL - SECONDS))
    shift 2
    case " ${PARTS:-$name} setup report " in *" $name "*) ;; *) return ;; esac
    [ -n "${QUICK:-}" ] && limit=300  # a dry run on a CPU: slow starts, the total still bounds it
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then
        echo "=== $name skipped: ${left}s left of ${TOTAL}s" | tee -a "$OUT/log.txt"
        return
    fi
    echo "=== $name (limit ${limit}s)" | tee -a "$OUT/log.txt"
    timeout -k 5 "$limit" "$@" >"$MODELS/part.txt" 2>&1
    echo "exit $? after ${SECONDS}s in all" >>"$MODELS/part.txt"
    cat "$MODELS/part.txt" >>"$OUT/log.txt"
    grep -v -e '^USDT' -e 'Warning' -e "^{'" -e 'warnings.warn' "$MODELS/part.txt" | tail -n 12  # not TRL's logs
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  timeout -k 5 45 $PY benchmarks/gpu_vs_trl.py setup "$MODELS" "${SETUP[@]}" 2>>"$OUT/log.txt"
} | tee "$OUT/machine.txt"
run=($PY benchmarks/gpu_vs_trl.py run)
part rloo-fixed 90 "${run[@]}" rloo fixed "$MODELS" "$OUT/rloo.json" --batches $BATCHES --profile --trace "$OUT/trace_decode.json.gz"
part trl-fixed 90 "${run[@]}" trl fixed "$MODELS" "$OUT/trl.json" --batches $BATCHES --profile
part rloo-varied 40 "${run[@]}" rloo varied "$MODELS" "$OUT/rloo.json" --batches $BATCHES
part trl-varied 45 "${run[@]}" trl varied "$MODELS" "$OUT/trl.json" --batches $BATCHES
# rloo as is prefers flash/efficient attention to cuDNN; torch-order runs torch's own order (cuDNN first on H100/H200)
part ab-torch-order 45 "${run[@]}" rloo fixed,varied "$MODELS" "$OUT/ab.json" --batches 2 --variant torch-order
part ab-avoid-recompile 30 env TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 "${run[@]}" rloo fixed "$MODELS" "$OUT/ab.json" --batches 2 --variant avoid-recompile
part trl-cb 30 "${run[@]}" trl fixed "$MODELS" "$OUT/trl.json" --batches 2 --variant cb
# rloo with transformers' continuous batching behind its engine seam: the faster sampler becomes the CUDA default
part rloo-cb 30 "${run[@]}" rloo fixed "$MODELS" "$OUT/ab.json" --batches 2 --variant cb
part repro-cudnn-on 40 env RLOO_SDPA_PRIORITY=torch $PY benchmarks/async_overlap.py "${REPRO[@]}" --only "synchronous;synchronous, fp32" \
    --out "$OUT/repro.json" --merge
part repro-cudnn-off 25 $PY benchmarks/async_overlap.py "${REPRO[@]}" --only synchronous --no-cudnn-sdp \
    --out "$OUT/repro.json" --merge
# last, with what is left: rloo's captured decode step and fused LM head, opt-in until a GPU has run them
part ab-graphs-fused 40 "${run[@]}" rloo fixed "$MODELS" "$OUT/ab.json" --batches 2 --variant graphs-fused
# limits: 45 in the set-up + 505 in the parts + 10 here = 560, and ~10 s installing the wheels
timeout -k 5 10 $PY benchmarks/gpu_report.py "$OUT" 2>>"$OUT/log.txt"
