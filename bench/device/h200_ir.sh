# 1 x H200 (counts part), issue 11: the Gluon kernels' GPU tests and the CUDA-graph tests after the launch's pdl
# argument became None -> GRAD_PDL at the call (5b49e61).
source bench/device/env.sh
R=/tmp/ir; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_gluon_graphs_ir.log 2>&1
tail -3 $R/gpu_tests_gluon_graphs_ir.log
pack
echo "elapsed $((SECONDS - T0)) s"
