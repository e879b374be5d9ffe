# 1 x H200 (counts part), issue 11: the gradient kernel's tiles with two or three programs an SM (64 x 128, 4 warps,
# 2 or 4 slices, BLOCK_K 64 / 32) against 128 x 128 with 8 warps, twice each in one process, queued, 8k-65k; then,
# with 64 x 128 in two slices as _TMA_GRAD, the op's GPU tests and replay tests, and the op against the compiled
# dense losses 1k-65k, queued and idle.
source bench/device/env.sh
R=/tmp/cw; mkdir -p $R
timeout $(left 150) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 9 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_grad_tiles2.jsonl \
    --variant "n128s2:_TMA_GRAD=(64,128,64,8,4,4,2,2)" --variant "n128s4:_TMA_GRAD=(64,128,64,8,4,4,2,4)" \
    --variant "k32p3:_TMA_GRAD=(64,128,32,8,4,5,3,4)" --variant "k64s3:_TMA_GRAD=(64,128,64,8,4,3,2,2)" \
    --variant "m128:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    --variant "n128s2b:_TMA_GRAD=(64,128,64,8,4,4,2,2)" --variant "n128s4b:_TMA_GRAD=(64,128,64,8,4,4,2,4)" \
    --variant "k32p3b:_TMA_GRAD=(64,128,32,8,4,5,3,4)" --variant "k64s3b:_TMA_GRAD=(64,128,64,8,4,3,2,2)" \
    --variant "m128b:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    > $R/contrastive_loss_h200_grad_tiles2_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_tiles2_queued20.log | grep -v siglip
pack
timeout $(left 330) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_grad_n128.log 2>&1
tail -2 $R/gpu_tests_ops_grad_n128.log
pack
timeout $(left 450) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    > $R/contrastive_loss_h200_grad_n128_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_n128_queued20.log
pack
timeout $(left 570) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_grad_n128_idle.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_n128_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
