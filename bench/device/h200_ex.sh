# 1 x H200 (counts part), issue 11: the 64 x 256 Gluon block (bench/device/tmp_wide.py, a copy of a8edf12's
# bench/diag_gluon_wide.py, for this call only) on the exact arguments of the op's first block (real LSEs), alone.
# (bench/device/tmp_real_args.py, also for this call only: records the op's first clip_grad_block call at 32k / 65k in a
# backward, then graph-times both kernels on exactly those arguments.)
source bench/device/env.sh
R=/tmp/ex; mkdir -p $R
timeout $(left 300) python bench/device/tmp_real_args.py > $R/wide_real_args_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/wide_real_args_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
