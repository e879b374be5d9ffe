# 1 x H200 (counts part): where ZeRO-0's host-bound step (h200_bp: 25.8 ms of host time in the
# engine's step) waits: ViT-B/32, micro-batch 256, the vitb32 preset's settings, the host waits
# for the GPU with their call stacks and the host's Python profile (--sync_points 2).
source bench/device/env.sh
R=/tmp/bq; mkdir -p $R
timeout $(left 300) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 0 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead --overlap_comm 0 \
    --warmup 3 --steps 20 --sync_points 2 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_zero0_syncpoints.log 2>&1
pack
grep -h "^throughput\|^# host waits" -A12 $R/pipeline_vitb32_256_zero0_syncpoints.log | head -40; echo "elapsed $((SECONDS - T0)) s"
