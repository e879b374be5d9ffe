# 1 x H200 (counts part), issue 11 (idle GPU at 32k: SigLIP 1.02-1.07x its dense loss in h200_ey / h200_fa / h200_fc):
# where an idle call loses time (bench/diag_idle_gaps.py: the wait to the first kernel, the GPU's gaps between the
# call's kernels, the kernels' busy time; from a profiler trace, whose own host cost inflates the gaps somewhat).
source bench/device/env.sh
R=/tmp/fe; mkdir -p $R
timeout 300 python bench/diag_idle_gaps.py --sizes 16384,32768,65536 --calls 5 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" > $R/idle_gaps_h200.log
cat $R/idle_gaps_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
