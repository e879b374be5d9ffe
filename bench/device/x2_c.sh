# 2 x H200 (NVLink; counts in full): where the ring's time goes (issue 11: the rings scale worse
# than disco at 32k-65k). torch.profiler tables of 3 calls of ring and disco at B = 32k and 65k
# (b = 16k and 32k per rank), rank 0, by host and device time.
source bench/device/env.sh
R=/tmp/x2c; mkdir -p $R
timeout $(left 400) torchrun --nproc_per_node 2 bench/bench_distributed.py --batches 32768 65536 --schemes ring disco \
    --profile 3 --out $R/distributed.jsonl > $R/profile_ring_x2.log 2>&1
pack
grep -v "^W1\|^\*\*\*" $R/profile_ring_x2.log | cut -c1-180 | head -150; echo "elapsed $((SECONDS - T0)) s"
