# 1 x H200 (counts half): ViT-B/32 at micro-batch 256, ZeRO-2 with flat parameters, beside the
# torch_compile anchor: the step as before (DeepSpeed's ZeRO step and synchronized throughput timer)
# against the step without host waits (pipeline.zero_step + the engine's timer default), with
# overlap_comm on and off; where the new step still waits; then the preset's micro-batch 1,024.
source bench/device/env.sh
R=/tmp/k; mkdir -p $R
timeout $(left 300) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile --on_device_step 0 --deepspeed_timers 1 \
    --out $R/pipeline.jsonl > $R/pipeline_256_before.log 2>&1
timeout $(left 420) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile --sync_points 3 \
    --out $R/pipeline.jsonl > $R/pipeline_256_after.log 2>&1
pack
timeout $(left 480) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_after_nooverlap.log 2>&1
pack
timeout $(left 585) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile \
    --out $R/pipeline.jsonl > $R/pipeline_1024_after.log 2>&1
pack
grep -h "^throughput\|# host waits" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
