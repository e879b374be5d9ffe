# 1 x H200 (counts half): the op after the one-assembly refactor (issue 11: one registered op for
# every scheme, the single-device loss as the Local sweep of ops/assembly.py). The GPU tests of the
# op, then the op against the compiled dense losses behind 20 ms of queued work (as h200_az).
source bench/device/env.sh
R=/tmp/bc; mkdir -p $R
timeout $(left 250) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
timeout $(left 570) python bench/bench_contrastive_loss.py --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl \
    > $R/contrastive_loss_q20.log 2>&1
pack
grep "^|" $R/contrastive_loss_q20.log
echo "elapsed $((SECONDS - T0)) s"
