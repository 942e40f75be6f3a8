#!/usr/bin/env bash
# The GPU check, on the GPU machine (Python 3.12 with its own CUDA torch; no internet), from the repository root,
# with the wheels of tests/gpu/prepare_wheels.py in .whl/ (see docs/gpu.md):
#
#   bash tests/gpu/run.sh            # tests/gpu (pytest -v), then bench/gpu.py; results in $OUT (or ./gpu-out)
#
# Under 7 minutes on one H200: wheel installs ~5 s, tests ~3 min, benchmark ~3 min. Each part runs under a timeout
# and writes as it goes, so a cut-off run still says what passed.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RL_CORE_CACHE=/tmp/rl-core-cache TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
# this repository's packages, built from source with the carried hatchling (installed, not editable, so that their
# entry points are registered)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/rl \
  packages/rl-core packages/rl-backend-dtensor packages/rl-backend-megatron packages/rl-rollout-hf \
  packages/rl-reward-server || exit 1
export PYTHONPATH=/tmp/rl:/tmp/site
python3 -c "import torch, ray, transformers; print('torch', torch.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
set -o pipefail
timeout 270 python3 -m pytest tests/gpu tests/rl_core/test_refit.py -v -p no:cacheprovider -o addopts="" 2>&1 |  tee "$OUT/gpu_tests.log"
echo "pytest exit: $?" | tee -a "$OUT/gpu.txt"
timeout 240 python3 bench/gpu.py --reps 3 --steps 4 2>&1 | tee "$OUT/gpu_bench.log"
echo "bench exit: $?" | tee -a "$OUT/gpu.txt"
cp bench/results/gpu_*.json "$OUT/" 2>/dev/null
ls -l "$OUT"
