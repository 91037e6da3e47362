#!/usr/bin/env bash
# Issues 28 and 29 on a lent GPU, in one run (about 6 minutes on an H100/H200):
#   - padding-free passes against padded ones (benchmarks/packing.py), Qwen2.5-0.5B's shape in bf16;
#   - the rollout worker against the synchronous loop (benchmarks/async_overlap.py), worker and trainer on one GPU;
#   - activation offloading and FSDP2 parameter offload: peak GPU memory (benchmarks/offload_memory.py).
# Each part has its own time limit, so one that hangs leaves the others' numbers. Results: $OUT (or ./gpu-out).
#   bash benchmarks/gpu_async_packing_offload.sh          # on the GPU machine, from the repository root
#   QUICK=1 bash benchmarks/gpu_async_packing_offload.sh  # tiny sizes, any machine: a dry run of the script
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if [ -n "${QUICK:-}" ]; then
    PACK=(--model tiny --repeats 2) LONG=(--model tiny --repeats 1 --limit 256) ASYNC=(--steps 3 --only "synchronous;worker")
    OFFLOAD=(--quick)
else
    PACK=(--model qwen0.5b --bf16 --repeats 5) LONG=(--model qwen0.5b --bf16 --repeats 3 --limit 1024)
    ASYNC=(--steps 6 --hidden 1024 --layers 8 --tokens 256 --only "synchronous;pipelined, in the trainer;worker")
    OFFLOAD=(--timeout 60)
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$OUT/machine.txt"
part() {  # part NAME SECONDS COMMAND...: run it with a time limit, its output to $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "exit $? after ${SECONDS}s in all"
    tail -n 40 "$OUT/$name.txt"
}
part packing 80 $PY benchmarks/packing.py "${PACK[@]}" --out "$OUT/packing.json"
part packing-long 80 $PY benchmarks/packing.py "${LONG[@]}" --out "$OUT/packing-long.json"
part async 130 $PY benchmarks/async_overlap.py "${ASYNC[@]}" --out "$OUT/async.json"
part offload 170 $PY benchmarks/offload_memory.py "${OFFLOAD[@]}" --out "$OUT/offload.json"
