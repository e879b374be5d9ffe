#!/usr/bin/env bash
# The default test run (CPU only, 6-9 minutes on 2 cores). GPU tests: pytest -m gpu (device machine).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
python -m pytest -q "$@"
