# 1 x H200 (counts part): host microseconds per CLIP gradient block at 32k and per part of it, issued behind a
# queued sleep (bench/diag_block_host.py): where the eager call's 9.2 ms of host time (h200_ej) goes.
source bench/device/env.sh
R=/tmp/el; mkdir -p $R
timeout $(left 200) python bench/diag_block_host.py --reps 200 > $R/block_host_32k_h200.log 2>&1
cat $R/block_host_32k_h200.log | tail -12
pack
echo "elapsed $((SECONDS - T0)) s"
