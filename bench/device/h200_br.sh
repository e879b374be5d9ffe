# 1 x H200 (counts part): ZeRO-0 with its FP16 wrapper's overflow check read once
# (pipeline/zero_step.py) against DeepSpeed's per-tensor reads (h200_bq: 63 waits a step), and
# ZeRO-1 with and without the on-device step, ViT-B/32 at micro-batch 256 with the vitb32 preset's
# settings, one process, host time by phase; then the same ZeRO-0 rows' host waits.
source bench/device/env.sh
R=/tmp/br; mkdir -p $R
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 0 1 --on_device_step 0 1 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead \
    --overlap_comm 0 --warmup 3 --steps 30 --host_phases 10 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_zero01.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_vitb32_256_zero01.log | head -12
timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 0 --on_device_step 1 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead \
    --overlap_comm 0 --warmup 3 --steps 10 --sync_points 2 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_zero0_syncpoints.log 2>&1
pack
grep -h "^# host waits" -A8 $R/pipeline_vitb32_256_zero0_syncpoints.log | head -12; echo "elapsed $((SECONDS - T0)) s"
