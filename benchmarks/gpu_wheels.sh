#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with the wheels benchmarks/gpu_vs_trl.sh installs on the GPU machine, whose Python
# (3.12, no network) has torch, transformers, accelerate, peft, pandas, pyarrow, xxhash and fsspec but neither TRL
# nor datasets: TRL 1.16.0 imports datasets when it is imported (its trainers' module does), and so does rloo.
# datasets' own needs that are missing there are dill and multiprocess; all four are pure Python (about 3 MB).
# Run from the repository root, here; then carry .whl with the run (the carry limit is 64 MiB in all).
#   bash benchmarks/gpu_wheels.sh
set -eu
PY=${PY:-.venv/bin/python}
mkdir -p .whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -l .whl
du -ch .whl/*.whl | tail -n 1
