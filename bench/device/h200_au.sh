# 1 x H200 (counts half): row bands against two-dimensional blocks for CLIP's large-B passes
# (bench_blocked_loss.py): the op's forward statistics and backward gradient pass at 32k / 65k
# against the same work over R x C blocks small enough to stay in L2, each checked against the op.
source bench/device/env.sh
R=/tmp/au; mkdir -p $R
timeout $(left 420) python bench/bench_blocked_loss.py --sizes 32768,65536 --reps 5 \
    --out $R/blocked_loss.jsonl > $R/blocked_loss.log 2>&1
pack
cat $R/blocked_loss.log | tail -40
echo "elapsed $((SECONDS - T0)) s"
