# 1 x H200 (counts half): h200_ay capped the backward blocks' rows at 8k-16k (5,888) to stay within a
# band's bytes and lost time there (1.05 / 1.00x the compiled dense loss against 0.96 / 0.99x with
# bands); now blocks only where 8,192 x 4,096 fit a band's bytes (B >= ~30k), full-width bands below.
# The op against the compiled dense losses behind 20 ms of queued work, and the peak listing at 8k / 16k.
source bench/device/env.sh
R=/tmp/az; mkdir -p $R
for b in 8192 16384; do
  timeout $(left 100) python bench/diag_loss_memory.py --b $b >> $R/loss_memory.log 2>&1
done
grep "peak above" $R/loss_memory.log
timeout $(left 420) python bench/bench_contrastive_loss.py --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl \
    > $R/contrastive_loss_q20.log 2>&1
pack
grep "^|" $R/contrastive_loss_q20.log
echo "elapsed $((SECONDS - T0)) s"
