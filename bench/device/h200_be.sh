# 1 x H200 (counts half): facts for the small-B and memory items of issue 11. Kernel tables of one
# forward + backward at B = 1,024 / 2,048 (ours CLIP and SigLIP, the compiled dense anchors), their
# times behind 20 ms of queued work, and the live allocations at the op's peak at 16k / 32k.
source bench/device/env.sh
R=/tmp/be; mkdir -p $R
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 1024,2048 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl \
    --profile 1024,2048 --profile-out $R/profile_small.txt > $R/contrastive_loss_small.log 2>&1
grep "^|" $R/contrastive_loss_small.log
for b in 8192 16384 32768; do
  for l in clip siglip; do
    timeout $(left 500) python bench/diag_loss_memory.py --b $b --loss $l >> $R/loss_memory.log 2>&1
  done
done
cat $R/loss_memory.log
pack
echo "elapsed $((SECONDS - T0)) s"
