# 1 x H200 (counts part), issue 11: the Gluon forward sums at 262k (h200_hs: 220 ms under Nsight against 10.2 ms at
# 65k, 16x the work; no more DRAM traffic a FLOP, L2 hit rate 76% against 89%, warps waiting on L1TEX). Which side
# sets it off, the rows (M) or the columns (N): 65k x 262k and 262k x 65k against the squares; and the items in
# groups of 132 / 264 column blocks (a group's columns of B stay within L2's reach chunk after chunk).
# (Ran with a `group` argument of gluon_kernels.clip_sums and `--groups` of bench/diag_gluon_sums.py, items in groups
# of column blocks; measured slower or small, removed before the commit: docs/benchmark_history.md, "seventeenth session".)
source bench/device/env.sh
R=/tmp/ht; mkdir -p $R
timeout $(left 420) python bench/diag_gluon_sums.py --sizes 65536,65536x262144,262144x65536,262144 --reps 3 \
    --groups 0 132 264 > $R/gluon_sums_groups_ht_h200.log 2>&1
cat $R/gluon_sums_groups_ht_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
