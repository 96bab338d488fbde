#!/usr/bin/env bash
# benchmarks/gpu.py on a lent GPU whose image has jax, flax, optax and orbax
# but no ml_collections (nor TensorFlow, nor a network). Before, where pip
# answers:
#   pip download ml_collections==1.1.0 --no-deps -d .wheels   # git ignores it
# then on the GPU machine, with `.wheels` carried along:
#   benchmarks/gpu.sh            # any gpu.py flags pass through
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import ml_collections' 2>/dev/null ||
  python3 -m pip install -q --no-deps .wheels/ml_collections-*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
PYTHONPATH=. XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 python3 benchmarks/gpu.py "$@"
