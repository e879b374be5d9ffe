# 1 x H200 (counts part), issue 11, the op as committed after h200_bk (CLIP statistics fused at
# every B with the interior-tile fast path; the backward's 4,096 x 4,096 blocks from 12,288 columns,
# full-width bands below as before): the GPU tests of the op, then the op against the compiled
# dense losses from 1k to 65k behind 20 ms of queued work and on an idle GPU (1k-16k), and the
# live allocations at the peak at 8k / 16k / 32k / 65k.
source bench/device/env.sh
R=/tmp/bl; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
timeout $(left 380) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl \
    > $R/contrastive_loss_q20.log 2>&1
grep "^|" $R/contrastive_loss_q20.log
pack
for b in 8192 16384 32768 65536; do
  timeout $(left 430) python bench/diag_loss_memory.py --b $b >> $R/loss_memory.log 2>&1
done
grep -E "^B=" $R/loss_memory.log
pack
timeout $(left 540) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
