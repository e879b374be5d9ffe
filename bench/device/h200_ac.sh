# 1 x H200 (counts half): ViT-B/32 ZeRO-3 with layer stacks at micro-batch 256, the lighter step
# (pipeline.zero3_step) and DeepSpeed's own step alternating in one process (1 0 1 0): the
# previous call (h200_ab) ran DeepSpeed's first and measured the lighter step slower.
source bench/device/env.sh
R=/tmp/ac; mkdir -p $R
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf stack --on_device_step 1 0 1 0 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_256_z3lighten_alt.log 2>&1
pack
grep -h "^throughput\|Error\|lightened" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
