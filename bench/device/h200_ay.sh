# 1 x H200 (counts half): h200_aw again after two memory fixes (h200_ax listed what the op held at its
# peak: the block buffer, still referenced by a view at the final cast, and at 16k a block + its fp32
# row sum larger than the full-width band had been): blocks are now at most a band's bytes with
# their row sum (5,888 x 4,096 at 8k-16k, 8,192 x 4,096 above). The peak listing, the GPU tests, then
# the op against the compiled dense losses behind 20 ms of queued work and on an idle GPU.
source bench/device/env.sh
R=/tmp/ay; mkdir -p $R
for b in 16384 32768 65536; do
  timeout $(left 120) python bench/diag_loss_memory.py --b $b >> $R/loss_memory.log 2>&1
done
grep "peak above" $R/loss_memory.log
timeout $(left 300) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 470 : 590))) python bench/bench_contrastive_loss.py --big "" --reps 7 \
      --anchors compiled_dense,dense_siglip --queued-ms $q --out $R/contrastive_loss.jsonl \
      > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log; done
echo "elapsed $((SECONDS - T0)) s"
