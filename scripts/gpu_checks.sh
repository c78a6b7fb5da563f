#!/usr/bin/env bash
# The GPU checks, as one call on a lent GPU machine (the device tool's `run`), from the repository root:
# the CUDA tests, the labs under nbval on CUDA (with the device log proving they ran there), and the GPU
# benchmarks. Each log goes to $OUT (7 files, the device log included; at most 8 come back). That machine reaches no registry;
# its image holds PyTorch, transformers, numpy, matplotlib, scikit-learn, tqdm, pytest and pytest-xdist
# (the device tool's KINDS.md lists it), but not nbval, the Jupyter kernel or their dependencies, which
# travel as wheels. Prepared here first:
#
#   mkdir -p .git/info; for p in /.whl/ /.gpudata/; do grep -qx "$p" .git/info/exclude || echo "$p" >> .git/info/exclude; done
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl nbval nbclient nbformat ipykernel ipython jupyter_client \
#     jupyter_core traitlets pyzmq tornado comm debugpy ipython_pygments_lexers matplotlib-inline \
#     fastjsonschema jsonschema jsonschema-specifications referencing rpds-py platformdirs decorator \
#     jedi parso pexpect ptyprocess prompt_toolkit wcwidth stack-data executing asttokens pure_eval
#   mkdir -p .gpudata/tinyshakespeare && cp "$TRANSFORMER_COURSE_DATA"/tinyshakespeare/input.txt .gpudata/tinyshakespeare/
#
# then run `BENCH_COMMIT=<git rev-parse --short HEAD here> bash scripts/gpu_checks.sh 2>&1` there with
# carry [".whl", ".gpudata"] (the results name that commit when the copy there has no .git). About 7
# minutes are expected; the steps' own limits add up to 585 s, under the 600 s one call may take. The
# bench logs' last lines are the JSON for bench/results/cuda/.
set -u
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench
export TRANSFORMER_COURSE_DATA=$PWD/.gpudata
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
git rev-parse --short HEAD 2>&1
git status --porcelain -- src bench 2>&1 | head -3

t "pytest -m cuda"
timeout 90 python3 -m pytest tests -m cuda -q -p no:cacheprovider --continue-on-collection-errors >"$OUT/pytest_cuda.log" 2>&1
t "pytest -m cuda: exit status $?"
tail -5 "$OUT/pytest_cuda.log"

t "the labs under nbval on CUDA"
(
  export TRANSFORMER_COURSE_DEVICE=cuda TRANSFORMER_COURSE_DEVICE_LOG=/tmp/devices.log LAB_BUDGET_S=600
  export OMP_NUM_THREADS=2 # eight kernels at once on 16 cores
  rm -f /tmp/devices.log
  timeout 150 python3 -m pytest --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg \
    -p no:cacheprovider -n 8 --dist loadfile notebooks >"$OUT/nbval.log" 2>&1
  echo "nbval: exit status $?"
  python3 scripts/check_device_log.py /tmp/devices.log notebooks
  cp /tmp/devices.log "$OUT/devices.log" 2>/dev/null
)
tail -25 "$OUT/nbval.log"

t "bench/lm.py, the GPU recipe"
timeout 100 python3 bench/lm.py --device cuda >"$OUT/lm.log" 2>&1
t "exit status $?"
grep -v '^{' "$OUT/lm.log" | tail -14
t "bench/lm.py, nanoGPT's schedule (lr 1e-3 to 1e-4 over 5,000 steps) in the same 60-s guard (which may cut its decay)"
timeout 100 python3 bench/lm.py --device cuda --train lr=1e-3 min_lr=1e-4 max_steps=5000 >"$OUT/lm_nanogpt.log" 2>&1
t "exit status $?"
grep -v '^{' "$OUT/lm_nanogpt.log" | tail -14
t "bench/attention.py, bfloat16, GPT-2 small's attention"
timeout 45 python3 bench/attention.py --device cuda --dtype bfloat16 --N 1024 --D 768 --H 12 >"$OUT/attention.log" 2>&1
t "exit status $?"
grep -v '^{' "$OUT/attention.log"
t "bench/decode.py at batch 1 and 64"
timeout 100 python3 bench/decode.py --device cuda --batches 1 64 >"$OUT/decode.log" 2>&1
t "exit status $?"
grep -v '^{' "$OUT/decode.log"
t "end"
