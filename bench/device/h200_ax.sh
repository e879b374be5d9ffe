# 1 x H200 (counts half): what the op holds at its peak at 16k / 32k / 65k (CLIP; SigLIP at 65k): the
# live allocations at the moment of the highest allocated memory, with where they were made.
source bench/device/env.sh
R=/tmp/ax; mkdir -p $R
for b in 16384 32768 65536; do
  timeout $(left 200) python bench/diag_loss_memory.py --b $b >> $R/loss_memory.log 2>&1
done
timeout $(left 240) python bench/diag_loss_memory.py --b 65536 --loss siglip >> $R/loss_memory.log 2>&1
pack
cat $R/loss_memory.log
echo "elapsed $((SECONDS - T0)) s"
