# 1 x H200 (counts half): why ZeRO-3 stays at 0.84x ZeRO-2 at micro-batch 1,024 with layer stacks,
# CUDA graphs or not: torch.profiler's host and device tables of two steps (device busy per step),
# and the host waits.
source bench/device/env.sh
R=/tmp/u; mkdir -p $R
timeout $(left 400) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead \
    --overlap_comm 0 --profile 2 --sync_points 2 --out $R/pipeline_prof.jsonl > $R/pipeline_1024_z3stack_profile.log 2>&1
pack
grep -h "^throughput\|^# profile\|host waits" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
