# 1 x H200 (counts part): the sweeps' d scale now accumulates in a copy of aux[b] (d6a94a7); one rank's compute at 32k /
# 65k with it (the path runs on the Gluon kernels; times as h200_gu's).
source bench/device/env.sh
R=/tmp/gw; mkdir -p $R
timeout $(left 200) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 --loss clip \
    --out $R/rank_compute.jsonl > $R/rank_compute_gw_h200.log 2>&1
grep -v "local_blocks\|weighted" $R/rank_compute_gw_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
