# 1 x H200 (counts part), issue 11: the op's GPU tests with the Gluon gradient blocks launched with programmatic
# dependent launch by default (gluon_kernels.GRAD_PDL), among them the new ordering test (a copy into A and a GEMM
# of P right before the blocks, eager and in a CUDA graph).
source bench/device/env.sh
R=/tmp/io; mkdir -p $R
timeout $(left 560) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_io.log 2>&1
tail -5 $R/gpu_tests_ops_io.log
pack
echo "elapsed $((SECONDS - T0)) s"
