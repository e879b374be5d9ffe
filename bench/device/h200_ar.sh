# 1 x H200 (counts half): every GPU test of ops with this session's kernels (the SigLIP pair log1p as a
# polynomial, the SigLIP statistics fused by TMA at every size, the gradient-with-loss tiles).
source bench/device/env.sh
R=/tmp/ar; mkdir -p $R
timeout $(left 420) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
