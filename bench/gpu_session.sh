#!/usr/bin/env bash
# What to run on a machine with an NVIDIA GPU, once the project and the dependencies it lacks
# are installed there (from the repository root, with PYTHONPATH naming the install and the
# checkout): the real-GPU tests, then the GPU packing bench.
#
# Split in TWO commands of under 10 minutes each (each after the install, which takes about a
# minute):
#     bash bench/gpu_session.sh tests   # nvidia-smi, the gpu-marked tests   (~5 min, cut at 8)
#     bash bench/gpu_session.sh bench   # python3 bench/gpu_packing.py       (~7 min, cut at 8.5)
# `bash bench/gpu_session.sh all` runs both in one command that may take 17 minutes.
#
# Everything lands in $OUT (default ./gpu-session-out), 3 files per part, so that a machine that
# hands back at most 8 files hands back all of them:
#     tests: nvidia-smi.txt, gpu-tests.log, gpu-tests.xml
#     bench: gpu_packing_bench.json, gpu_packing_bench.md, gpu-bench.log
# The bench writes its JSON and table after every case, so a run cut short keeps what it
# measured. The exit status is the last part's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-session-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

tests() {
    {
        timeout 60 nvidia-smi
        timeout 60 nvidia-smi -L
        timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo 'not on PATH')"
        python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
    } 2>&1 | tee "$OUT/nvidia-smi.txt"
    # -x: the first failure stops the run (its log says which), so the older gpu tests go
    # first and the new features' last; the bench runs either way
    timeout -k 20 480 python3 -m pytest -m gpu -p no:cacheprovider -q -x -rs \
        --junitxml "$OUT/gpu-tests.xml" \
        tests/test_devices.py tests/test_resource_trace.py tests/test_gpu_slots.py \
        tests/test_gpu_real.py \
        2>&1 | tee "$OUT/gpu-tests.log"
}

bench() {
    # SIGINT at 510 s: the bench stops its running sweep as Ctrl-C would, and its MPS daemon
    timeout -s INT -k 30 510 python3 bench/gpu_packing.py --out "$OUT" --budget-s 420 \
        2>&1 | tee "$OUT/gpu-bench.log"
}

case "${1:-}" in
    tests) tests ;;
    bench) bench ;;
    all) tests; bench ;;
    *) echo "usage: bash bench/gpu_session.sh tests|bench|all" >&2; exit 2 ;;
esac
