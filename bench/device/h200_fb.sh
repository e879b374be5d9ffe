# 1 x H200 (counts part): why ops/launch.py's direct launches never engaged on Triton 3.6 (h200_fa): its launch hooks are
# empty chains (HookChain), not None (bench/device/tmp_dbg.py, for this call only, printed them).
source bench/device/env.sh
R=/tmp/fb; mkdir -p $R
python bench/device/tmp_dbg.py 2>&1 | grep -v "leaked\|nanobind\|^ - " | tee $R/dbg.log
pack
