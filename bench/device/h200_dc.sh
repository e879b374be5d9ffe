# 1 x H200 (counts part), issue 11: a warp-specialised Gluon copy of the CLIP gradient block (one loader warp,
# two consumer warpgroups on alternate tiles: one's epilogue beside the other's MMA) against the op's kernel
# and cuBLAS on the backward's block at 32k / 65k, same process (bench/diag_gluon_grad.py); the replay tests.
source bench/device/env.sh
R=/tmp/dc; mkdir -p $R
timeout $(left 100) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -2 $R/gpu_tests_graphs.log
timeout $(left 400) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_h200.log 2>&1
cat $R/gluon_grad_h200.log | tail -60
pack
echo "elapsed $((SECONDS - T0)) s"
