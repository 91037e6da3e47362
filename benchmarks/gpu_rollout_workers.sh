#!/usr/bin/env bash
# Issue 28 on a lent GPU (about 4 minutes on an H100/H200): benchmarks/async_overlap.py's synchronous loop
# against 1, 2 and 4 rollout workers sharing the trainer's GPU (weights over gloo through host memory), a Llama
# of hidden 1,024, 8 layers, 256-token completions in bf16. Results: $OUT (or ./gpu-out).
#   bash benchmarks/gpu_rollout_workers.sh          # on the GPU machine, from the repository root
#   QUICK=1 bash benchmarks/gpu_rollout_workers.sh  # tiny sizes, any machine: a dry run of the script
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ -n "${QUICK:-}" ]; then
    ASYNC=(--steps 3 --only "synchronous;worker;2 workers")
else
    ASYNC=(--steps 5 --hidden 1024 --layers 8 --tokens 256 --only "synchronous;worker;2 workers;4 workers")
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$OUT/machine.txt"
echo "=== async (limit ${LIMIT:-420}s)"
timeout "${LIMIT:-420}" $PY benchmarks/async_overlap.py "${ASYNC[@]}" --out "$OUT/async.json" >"$OUT/async.txt" 2>&1
echo "exit $? after ${SECONDS}s"
tail -n 40 "$OUT/async.txt"
