# 1 x H200 (counts half): ZeRO-3 with flat per-block parameters and the one-rank fetch kept on the
# device, beside ZeRO-2 with the preset's settings and the torch_compile anchor (micro-batch 256, one
# process); then rows that isolate each change (ZeRO-3 as before, flat with DeepSpeed's own fetch
# wait); then the host waits left in the ZeRO-3 step.
source bench/device/env.sh
# the committed loss op (bench/device/_head, when present), not a working copy being edited
[ -d bench/device/_head/ops ] && cp bench/device/_head/ops/*.py ops/
R=/tmp/o; mkdir -p $R
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --flat_parameters 1 --impls triton --anchors torch_compile --compile_mode reduce-overhead \
    --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_256_z3flat.log 2>&1
pack
timeout $(left 480) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --flat_parameters 0 1 --on_device_step 0 --impls triton --anchors --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3_isolate.log 2>&1
pack
timeout $(left 590) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --flat_parameters 1 --impls triton --anchors --overlap_comm 0 --sync_points 2 \
    --out $R/pipeline_sync.jsonl > $R/pipeline_256_z3flat_syncpoints.log 2>&1
pack
grep -h "^throughput\|^# ZeRO" $R/pipeline_*.log | sort -u; tail -25 $R/pipeline_256_z3flat_syncpoints.log; echo "elapsed $((SECONDS - T0)) s"
