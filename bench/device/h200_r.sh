# 1 x H200 (counts half): ZeRO-3 with each tower's stack of blocks as its unit
# (model.zero3_leaf_layers "stack": two fetches and two compiled graphs a step) against per-block
# units and ZeRO-2 with the preset's settings, next to the torch_compile anchor, micro-batch 256,
# then the same rows at 1,024.
source bench/device/env.sh
R=/tmp/r; mkdir -p $R
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf 1 stack --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_256_z3stack.log 2>&1
pack
timeout $(left 590) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 3 --zero3_leaf stack --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_1024_z3stack.log 2>&1
pack
grep -h "^throughput\|^# ZeRO\|Error" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
