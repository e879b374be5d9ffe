# 1 x H200 (counts part), issue 11: h200_fe's trace with the impls interleaved as in the bench (the order rotating each
# round), to see what the interleaved SigLIP call at 32k (13.1-13.5 ms against 11.8 on its own) spends its time on;
# then the same calls one impl at a time again, in the same process.
source bench/device/env.sh
R=/tmp/ff; mkdir -p $R
timeout 200 python bench/diag_idle_gaps.py --sizes 32768 --calls 12 --interleave 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" > $R/idle_gaps_interleaved_h200.log
timeout 200 python bench/diag_idle_gaps.py --sizes 32768 --calls 6 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" >> $R/idle_gaps_interleaved_h200.log
cat $R/idle_gaps_interleaved_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
