# 1 x H200 (counts part), issue 10: h200_fj's DeepCompile row sat past DeepSpeed's all-gather profiling of its
# step-5 passes (prefetch, selective gather) for the rest of its 380 s. Here DeepCompile with only its basic
# pass (the ZeRO-3 gathers and releases in the compiled graph, no profiling: engine.compile(schedule=...)),
# ZeRO-2 (preset settings) first and again after, the README's ZeRO-3 towers last, one process
# (bench/device/tmp_deepcompile.py, for these calls only; its DeepCompile row is now bench_pipeline.py --deepcompile basic).
source bench/device/env.sh
R=/tmp/fk; mkdir -p $R; export R
timeout 570 python bench/device/tmp_deepcompile.py 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once\|return func\|^size:" > $R/deepcompile_basic_z3_h200.log
grep -h "^throughput\|^#####\|^# host\|^# engine\|Error\|error" $R/deepcompile_basic_z3_h200.log | head -40
pack
echo "elapsed $((SECONDS - T0)) s"
