# 1 x H200 (counts part), issue 11: the gradient tiles 128 x 128 with the epilogue in two slices (the new
# _TMA_GRAD) against the old 128 x 64 tiles, twice each in one process, behind 20 ms of queued work, 8k-65k,
# with the compiled dense loss; then the op's GPU tests with the new tiles.
source bench/device/env.sh
R=/tmp/cs; mkdir -p $R
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 9 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_grad_split.jsonl \
    --variant "old:_TMA_GRAD=(128,64,64,8,4,4,2)" --variant "new:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    --variant "old2:_TMA_GRAD=(128,64,64,8,4,4,2)" --variant "new2:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    > $R/contrastive_loss_h200_grad_split_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_split_queued20.log | grep -v siglip
pack
timeout $(left 560) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_grad_split.log 2>&1
tail -3 $R/gpu_tests_ops_grad_split.log
pack
echo "elapsed $((SECONDS - T0)) s"
