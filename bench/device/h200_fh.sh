# 1 x H200 (counts part), issue 11: each Gluon gradient block's GPU time inside the op, 64 x 128 tiles against 64 x 256
# (bench/device/tmp_wide.py, a copy of a8edf12's bench/diag_gluon_wide.py, and tmp_wide_launches.py, for this call only): is h200_ev's in-op slowdown of the 64 x 256
# block uniform over the blocks, or in some of them?
source bench/device/env.sh
R=/tmp/fh; mkdir -p $R
timeout 300 python bench/device/tmp_wide_launches.py 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" > $R/wide_launches_h200.log
cat $R/wide_launches_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
