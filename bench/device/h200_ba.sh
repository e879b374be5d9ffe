# 1 x H200 (counts half): the GPU tests of the op after the review's rewrite of the backward's block
# loop (one loop for every case, the one-block path no longer written apart; no change of numbers
# intended).
source bench/device/env.sh
R=/tmp/ba; mkdir -p $R
timeout $(left 280) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
