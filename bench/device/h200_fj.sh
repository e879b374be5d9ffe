# 1 x H200 (counts part), issue 10: DeepSpeed's DeepCompile for ZeRO-3 (whole towers compiled by DeepSpeed,
# its gathers and releases in the graph, prefetch and selective gather after 5 steps) given most of a call:
# h200_m / h200_n had only the ~115 s a call had left (past DeepSpeed's all-gather profiling, no timed step).
# ZeRO-2 (preset settings) before and after, the README's ZeRO-3 towers last, all in one process
# (bench/device/tmp_deepcompile.py, for these calls only; its DeepCompile row is now bench_pipeline.py --deepcompile basic).
source bench/device/env.sh
R=/tmp/fj; mkdir -p $R; export R
timeout 570 python bench/device/tmp_deepcompile.py 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once\|return func" > $R/deepcompile_z3_h200.log
grep -h "^throughput\|^#####\|^# host\|Error\|error" $R/deepcompile_z3_h200.log | head -40
ls -la .tex/tex/ 2>/dev/null; mkdir -p $OUT/tex; for d in .tex/tex/dc*; do [ -d $d ] && tar czf $OUT/tex/$(basename $d).tgz $d; done
pack
echo "elapsed $((SECONDS - T0)) s"
