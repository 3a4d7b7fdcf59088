#!/usr/bin/env bash
# The GPU session: the gpu-marked tests, then the GPU packing bench, in ONE command that ends
# within 7 minutes (8 with an install of about 35 s before it), on a machine with an NVIDIA GPU
# where the project and its dependencies import (installed, or PYTHONPATH naming them and the
# checkout). From the repository root:
#
#     bash bench/gpu_session.sh           # all: facts, tests, bench                 (~7 min)
#     bash bench/gpu_session.sh tests     # facts, tests                             (~3.5 min)
#     bash bench/gpu_session.sh bench     # facts, a warm-up sweep, the bench        (~7 min)
#     bash bench/gpu_session.sh fused     # facts, fused trials on the GPU           (~5 min)
#
# The steps write into $OUT (default ./gpu-session-out) as they go, 6 files in all (a machine
# that hands back at most 8 hands back every one):
#   facts  nvidia-smi (GPU, driver, memory, compute mode), the MPS binaries, torch and its
#          CUDA; stops here if the project does not import                     nvidia-smi.txt
#   tests  pytest -m gpu on the NVML and MPS contracts and the GPU test files, every test under
#          its own timeout (90 s where it names none), no test stopping the others, the step
#          under 210 s (SIGINT: pytest still writes its report)
#                                                                 gpu-tests.log, gpu-tests.xml
#   bench  bench/gpu_packing.py, its --budget-s what is left of FURCATE_GPU_SESSION_S (420 s
#          from this script's start) less 10 s, under `timeout` at that end (SIGINT: it stops
#          its sweep and writes what it measured; its cases are ordered so that a cut run keeps
#          the anchors, auto, the biggest counts and out-of-memory)
#                                        gpu_packing_bench.json, gpu_packing_bench.md, gpu-bench.log
#   fused  (its own call) bench/fused_training.py --device cuda (the fused loop against one fit
#          per config, MLP at 8/32/128) and bench/fused_sweep.py --accelerator cuda (32 tiny
#          configs through the CLI on the GPU, fuse=auto against one job at a time), each
#          under `timeout`                  fused-training.log, fused-sweep.log, fused_*.json
# The exit status: 3 where the project does not import, else the tests' where they failed,
# else the bench's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-session-out}"
SESSION_S="${FURCATE_GPU_SESSION_S:-420}"
TESTS_S="${FURCATE_GPU_TESTS_S:-210}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

left() { echo $((SESSION_S - SECONDS)); }

facts() {
    {
        timeout 30 nvidia-smi
        timeout 30 nvidia-smi --format=csv \
            --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode,persistence_mode
        echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo 'not on PATH')"
        echo "cores: $(nproc); memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
    } 2>&1 | tee "$OUT/nvidia-smi.txt"
    # the imports every later step needs, timed: a missing one ends the session here
    timeout 120 python3 -c '
import time; began = time.time()
import hydra, mlflow, optuna, pynvml, torch, furcate_hydra
print("torch", torch.__version__, "CUDA", torch.version.cuda, "hydra", hydra.__version__,
      "mlflow", mlflow.__version__, f"(imported in {time.time() - began:.1f} s)")
' 2>&1 | tee -a "$OUT/nvidia-smi.txt"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
        echo "the project or a dependency does not import: install them, or set PYTHONPATH" >&2
        exit 3
    fi
}

tests() {
    # the contracts first (~30 s), then the sweeps of test_gpu_real.py (~2.5 min: MPS, auto,
    # out of memory); last, where a cut falls, the two tests the contracts mostly repeat
    timeout -s INT -k 20 "$TESTS_S" python3 -m pytest -m gpu -n 0 -p no:cacheprovider -q -rfEs \
        --timeout 90 --durations 20 --junitxml "$OUT/gpu-tests.xml" \
        tests/contracts tests/test_devices.py tests/test_gpu_real.py \
        tests/test_resource_trace.py tests/test_gpu_slots.py tests/test_fusion_width.py \
        2>&1 | tee "$OUT/gpu-tests.log"
    return "${PIPESTATUS[0]}"
}

bench() {
    local warm=$1 end
    end=$(($(left) - 10))
    if [ "$end" -lt 60 ]; then
        echo "bench: not run, ${end} s left" | tee "$OUT/gpu-bench.log"
        return 0
    fi
    # SIGINT at the end: the bench stops its running sweep as Ctrl-C would, and its MPS daemon
    timeout -s INT -k 40 "$((end + 5))" python3 bench/gpu_packing.py --out "$OUT" \
        --budget-s "$end" $warm 2>&1 | tee "$OUT/gpu-bench.log"
    return "${PIPESTATUS[0]}"
}

fused() {
    timeout -k 20 120 python3 bench/fused_training.py --device cuda --models mlp \
        --sizes 8 32 128 2>&1 | tee "$OUT/fused-training.log"
    cp bench/results/fused_training.json "$OUT/" 2>/dev/null
    timeout -s INT -k 20 "$(($(left) - 10))" python3 bench/fused_sweep.py --accelerator cuda \
        --configs 32 --epochs 30 2>&1 | tee "$OUT/fused-sweep.log"
    local code=${PIPESTATUS[0]}
    cp bench/results/fused_sweep.json "$OUT/" 2>/dev/null
    return "$code"
}

step() {  # step NAME COMMAND...: run it, say how long it took and how it ended
    local began=$SECONDS code
    "${@:2}"
    code=$?
    echo "== $1: $((SECONDS - began)) s, exit $code (session at ${SECONDS} s)"
    return $code
}

case "${1:-all}" in
    tests) step facts facts && step tests tests ;;
    bench) step facts facts && step bench bench "" ;;
    fused) step facts facts && step fused fused ;;
    all)
        step facts facts || exit $?
        step tests tests
        tested=$?
        step bench bench --no-warm-up  # the tests have warmed CUDA and the page cache
        benched=$?
        ls -l "$OUT"
        [ "$tested" != 0 ] && exit "$tested"
        exit "$benched"
        ;;
    *) echo "usage: bash bench/gpu_session.sh [all|tests|bench|fused]" >&2; exit 2 ;;
esac
