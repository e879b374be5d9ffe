# 1 x H200 (counts part): after the review's refactors (one cached compute capability for the TMA and Gluon
# checks; the graph cache's device taken from the entry on replay): the Gluon and replay GPU tests.
source bench/device/env.sh
R=/tmp/dt; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q tests/ops/test_gluon_gpu.py tests/ops/test_graphs_gpu.py > $R/gpu_tests_review.log 2>&1
tail -2 $R/gpu_tests_review.log
pack
