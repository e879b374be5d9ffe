# 2 x H200 (counts in full): bench/diag_ring_sync.py again after its timing moved onto
# bench_distributed's measure (the timer starts behind the queued work instead of subtracting it).
source bench/device/env.sh
R=/tmp/x2h; mkdir -p $R
timeout $(left 300) torchrun --nproc_per_node 2 bench/diag_ring_sync.py --batches 16384 32768 65536 > $R/ring_sync_x2.log 2>&1
pack
grep -v "^W1\|^\*\*\*\|UserWarning\|return func" $R/ring_sync_x2.log | tail -14; echo "elapsed $((SECONDS - T0)) s"
