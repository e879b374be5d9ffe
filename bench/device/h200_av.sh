# 1 x H200 (counts half): h200_au's backward comparison again at 16k / 32k / 65k with the peak memory
# and an fp64 reference for the first 512 rows of dI and dT (the same bf16 P, multiplied in fp64), and
# block shapes around the fastest of h200_au (8192 x 8192): rows x 8192 up to the op's band budget.
source bench/device/env.sh
R=/tmp/av; mkdir -p $R
timeout $(left 300) python bench/bench_blocked_loss.py --sizes 16384,32768,65536 --reps 7 --no-forward \
    --out $R/blocked_loss.jsonl > $R/blocked_loss.log 2>&1
pack
cat $R/blocked_loss.log | tail -40
echo "elapsed $((SECONDS - T0)) s"
