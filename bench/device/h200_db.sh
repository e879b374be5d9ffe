# 1 x H200 (counts part), issue 11: a failed capture left torch's CUDA generator marked as capturing (every
# later random draw on the device raised); GraphCache now ends it with an empty capture. The replay tests
# (the failed-capture test now draws random numbers after it), the op's GPU tests.
source bench/device/env.sh
R=/tmp/db; mkdir -p $R
timeout $(left 120) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
timeout $(left 300) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
