# 1 x H200 (counts part), issue 11: the op's Gluon CLIP gradient kernel now takes 64 x 256 tiles a consumer, the
# epilogue on 64-column parts (ops/gluon_kernels.GRAD_TILES; h200_eq). The op's GPU tests; the kernel against the
# 64 x 128 tiles and cuBLAS on the backward's first block at 4k-65k (graph replay), and sustained for seconds with
# the SM clock and power sampled (with cuBLAS's 8192^3 GEMM, the bench's roofline rate, sustained too).
source bench/device/env.sh
R=/tmp/es; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_wide.log 2>&1
tail -3 $R/gpu_tests_ops_wide.log
pack
timeout $(left 330) python bench/diag_gluon_grad.py --sizes 4096,8192,16384,32768,65536 --reps 9 \
    --tiles 64,256,64,4,64 64,128,64,6,128 > $R/gluon_grad_wide_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/gluon_grad_wide_h200.log
pack
timeout $(left 450) python bench/diag_block_power.py --sizes 32768,65536 --seconds 3 --tiles 64,128,64,6,128 \
    > $R/block_power_wide_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/block_power_wide_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
