# 1 x H200 (counts part), issue 11: h200_ff's interleaved trace at 32k with the host's time from each call's start to its
# first kernel launch (bench/diag_idle_gaps.py, the CPU-side launch events: the GPU-side first-kernel column is not
# aligned with the host's clock).
source bench/device/env.sh
R=/tmp/fg; mkdir -p $R
timeout 200 python bench/diag_idle_gaps.py --sizes 32768,65536 --calls 12 --interleave 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" > $R/idle_gaps_first_launch_h200.log
cat $R/idle_gaps_first_launch_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
