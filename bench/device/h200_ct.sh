# 1 x H200 (counts part), issue 11, the gradient tiles 128 x 128 with a two-slice epilogue (_TMA_GRAD): the
# op's GPU tests and the replay tests; the op against the compiled dense losses, CLIP and SigLIP 1k-65k,
# behind 20 ms of queued work and on an idle GPU.
source bench/device/env.sh
R=/tmp/ct; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_grad_split.log 2>&1
tail -3 $R/gpu_tests_ops_grad_split.log
pack
timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    > $R/contrastive_loss_h200_grad_split_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_split_queued20.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_grad_split_idle.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_split_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
