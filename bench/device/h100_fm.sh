# 1 x H100 (counts part; no H200 could be started), issue 10: h200_fk's DeepCompile row (basic pass only) reached no timed step in 300 s.
# The same row alone, each engine step's wall time printed, the Python stacks every 100 s, dynamo's recompile
# and graph-break logs (bench/device/tmp_deepcompile.py, for these calls only; its DeepCompile row is now bench_pipeline.py --deepcompile basic).
source bench/device/env.sh
R=/tmp/fm; mkdir -p $R; export R
STEP_TRACE=1 TORCH_LOGS="recompiles,graph_breaks" timeout 420 python bench/device/tmp_deepcompile.py zero3_deepcompile 2>&1 \
  | grep -v "leaked\|nanobind\|UserWarning\|warn_once\|return func\|^size:" > $R/deepcompile_trace_h200.log
grep -h "^throughput\|^#####\|^# \|Error\|error\|Recompil\|Graph break" $R/deepcompile_trace_h200.log | cut -c1-250 | head -60
pack
echo "elapsed $((SECONDS - T0)) s"
