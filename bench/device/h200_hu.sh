# 1 x H200 (counts part), issue 11: the Gluon forward sums at 262k (h200_ht: 442 TFLOP/s against 569-600 at 65k x 262k,
# 262k x 65k and 65k, the same items; groups of 132 / 264 column blocks slower at 65k, 264 faster at 262k). Whether
# it is the programs running the same row tile at once (132 programs' row-sum atomics on the same lines, the same A
# tile): each program takes its items' row tiles from its own offset on (--rotate 1).
# (Ran with a `group` argument of gluon_kernels.clip_sums and `--groups` of bench/diag_gluon_sums.py, items in groups
# of column blocks; measured slower or small, removed before the commit: docs/benchmark_history.md, "seventeenth session".)
source bench/device/env.sh
R=/tmp/hu; mkdir -p $R
timeout $(left 420) python bench/diag_gluon_sums.py --sizes 32768,65536,65536x262144,262144 --reps 3 \
    --groups 0 264 --rotate 0 1 > $R/gluon_sums_rotate_hu_h200.log 2>&1
cat $R/gluon_sums_rotate_hu_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
