# 1 x H200 (counts part): after the review's refactor (one _store_p for the CLIP slices and SigLIP; the diag
# scripts' skips through bench_loss_kernels._try): the op's GPU tests and replay tests, and a short run of each
# diag script (a tile that cannot launch, 256 x 256, is skipped and named).
source bench/device/env.sh
R=/tmp/cy; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_review.log 2>&1
tail -2 $R/gpu_tests_ops_review.log
timeout $(left 330) python bench/diag_strips.py --sizes 32768 --no-modes --grad 256,256,64,8,8,4,1,2 \
    > $R/diag_strips_review.log 2>&1
grep "^B=\|^#" $R/diag_strips_review.log | cut -c1-160
timeout $(left 420) python bench/diag_grad_epilogue.py --sizes 32768 --tiles 256,256,64,8,8,4,1 \
    > $R/diag_grad_epilogue_review.log 2>&1
grep "^B=\|^#" $R/diag_grad_epilogue_review.log | cut -c1-120 | head -50
pack
echo "elapsed $((SECONDS - T0)) s"
