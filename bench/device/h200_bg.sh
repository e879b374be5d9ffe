# 1 x H200 (counts part): where the ZeRO-3 step with whole towers as units spends its time against
# ZeRO-2 (ViT-B/32, micro-batch 256, flat parameters, CUDA-graphed stacks, overlap_comm off, the
# engine's kept waits): device busy time and kernel tables (--profile 3), the host waits and the
# host's Python profile (--sync_points 2). FusedAdam from .tex (h200_bf's build).
source bench/device/env.sh
R=/tmp/bg; mkdir -p $R
timeout $(left 400) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --profile 3 --sync_points 2 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3tower_profile.log 2>&1
pack
grep -h "^throughput\|Error\|device busy" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
