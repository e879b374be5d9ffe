# 1 x H200 (counts part), issue 11: the Gluon forward sums at 262k in one launch run at 439-465 TFLOP/s, 65k x 262k at
# 547-569 (h200_ht, h200_hu): the same items, a quarter of the launch's length. The sums in launches over row slabs
# of 16k / 32k / 65k rows at 65k-262k; at 32k slabs of 8k / 16k beside the rotated order.
# (Ran with `--slabs ROWS` of bench/diag_gluon_sums.py, launches over slabs of that many rows, replaced before the
# commit by `--launch-logits`, the rule clip_sums now applies itself: docs/benchmark_history.md, "seventeenth session".)
source bench/device/env.sh
R=/tmp/hw; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_sums.py --sizes 32768 --reps 5 --slabs 0 8192 16384 --rotate 0 1 \
    > $R/gluon_sums_slabs_32k_hw_h200.log 2>&1
cat $R/gluon_sums_slabs_32k_hw_h200.log
timeout $(left 450) python bench/diag_gluon_sums.py --sizes 65536,131072,262144 --reps 5 --slabs 0 16384 32768 65536 \
    > $R/gluon_sums_slabs_hw_h200.log 2>&1
cat $R/gluon_sums_slabs_hw_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
