# 1 x H100 (counts part), patch dropout (model.patch_dropout, FLIP): its GPU test (inductor's own random numbers,
# CUDA-graph replays: new subsets every step, the same from a seed), then ViT-B/16 at micro-batch 256, ZeRO-2, the
# presets' settings, patch_dropout 0 / 0.5 / 0.75 against the compiled plain loop, in one process.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/fw; mkdir -p $R
timeout 150 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -3 $R/gpu_tests_patch_dropout_h100.log
pack
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb16 --micro_batch 256 \
    --zero 2 --on_device_step 2 --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 20 --patch_dropout 0 0.5 0.75 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb16_256_patch_dropout_h100.log 2>&1
pack
grep -h "^throughput\|Error\|error" $R/pipeline_vitb16_256_patch_dropout_h100.log | head -8; echo "elapsed $((SECONDS - T0)) s"
