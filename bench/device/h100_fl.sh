# 1 x H100 (counts part), issue 10 on an H100 80GB: h100_fk ran bench_pipeline.py's defaults (no flat parameters, no CUDA
# graphs: 2,118 samples/s against the compiled loop's 4,347); here the vitb32 preset's settings (flat parameters, the
# step on the device, CUDA-graphed stacks, overlap_comm off), ZeRO-2, against the same anchor.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/fl; mkdir -p $R
timeout 270 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --on_device_step 2 --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_preset_h100.log 2>&1
pack
grep -h "^throughput\|Error\|error" $R/pipeline_vitb32_256_preset_h100.log | head -8; echo "elapsed $((SECONDS - T0)) s"
