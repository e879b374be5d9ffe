# 2 x H200 (counts in full): the distributed loss's host waits per call and the cost of the
# per-call size check (bench/diag_ring_sync.py), ring and disco at B = 32k and 65k.
source bench/device/env.sh
R=/tmp/x2d; mkdir -p $R
timeout $(left 300) torchrun --nproc_per_node 2 bench/diag_ring_sync.py --batches 32768 65536 > $R/ring_sync_x2.log 2>&1
pack
grep -v "^W1\|^\*\*\*" $R/ring_sync_x2.log | tail -40; echo "elapsed $((SECONDS - T0)) s"
