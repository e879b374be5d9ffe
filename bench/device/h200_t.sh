# 1 x H200 (counts half): ZeRO-3 layer stacks replayed as CUDA graphs (compile_mode
# reduce-overhead now applies to stacks: the moving gathered weights are copied into the graphs'
# inputs), against ZeRO-2 with the preset's settings and the torch_compile anchor, micro-batch 256
# and 1,024; then the host waits left in the stack step.
source bench/device/env.sh
R=/tmp/t; mkdir -p $R
timeout $(left 300) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_256_z3stack_cudagraphs.log 2>&1
pack
timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_1024_z3stack_cudagraphs.log 2>&1
pack
timeout $(left 590) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead \
    --overlap_comm 0 --sync_points 2 --out $R/pipeline_sync.jsonl > $R/pipeline_256_z3stack_cudagraphs_syncpoints.log 2>&1
pack
grep -h "^throughput\|Error\|skipping cudagraphs\|re-record" $R/pipeline_*.log | sort | uniq -c | head -30; echo "elapsed $((SECONDS - T0)) s"
