# 1 x H200 (counts part), issue 11: h200_eu again with the op's kernels profiled per setting (bench/diag_tiles_ab.py
# --profile): the 64 x 256 Gluon tiles were 1.2-3.5% slower than the 64 x 128 ones end to end (the kernel alone 3-9%
# faster): which kernel's time moves inside the op.
source bench/device/env.sh
R=/tmp/ev; mkdir -p $R
timeout $(left 400) python bench/diag_tiles_ab.py --sizes 16384,32768,65536 --rounds 20 --profile 3 > $R/tiles_ab_profile_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/tiles_ab_profile_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
