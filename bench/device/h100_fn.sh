# 1 x H100 (counts part), issue 10: h100_fm's trace showed DeepCompile's first 100 s in ninja building its op and
# the next 200 s in its graph profiler and the first backward. The same warm machine (the op already built under
# .tex/tex/dc, not carried again): the DeepCompile row (basic pass) with 470 s, then ZeRO-2 (preset) in the same
# process (bench/device/tmp_deepcompile.py, for these calls only; its DeepCompile row is now bench_pipeline.py --deepcompile basic).
source bench/device/env.sh
R=/tmp/fn; mkdir -p $R; export R
ls .tex/tex
STEP_TRACE=1 DC_SECONDS=470 timeout 590 python bench/device/tmp_deepcompile.py zero3_deepcompile zero2_again 2>&1 \
  | grep -v "leaked\|nanobind\|UserWarning\|warn_once\|return func\|^size:\|^\[rank0\]:V" > $R/deepcompile_warm_h100.log
grep -h "^throughput\|^#####\|^# \|Error\|error" $R/deepcompile_warm_h100.log | cut -c1-250 | head -60
pack
echo "elapsed $((SECONDS - T0)) s"
