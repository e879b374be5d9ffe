# 1 x H200 (counts half): where the ZeRO-3 step with layer stacks spends its time at micro-batch
# 256 (host waits and a Python profile, then torch.profiler's tables).
source bench/device/env.sh
R=/tmp/s; mkdir -p $R
timeout $(left 280) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors --overlap_comm 0 --sync_points 2 \
    --out $R/pipeline_sync.jsonl > $R/pipeline_256_z3stack_syncpoints.log 2>&1
pack
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors --overlap_comm 0 --profile 3 \
    --out $R/pipeline_prof.jsonl > $R/pipeline_256_z3stack_profile.log 2>&1
pack
grep -h "^throughput" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
