# 1 x H200 (counts part): issue 10, "the presets are the fast configurations": the vitl14 preset is
# ZeRO-3 with per-block units, plain parameters, torch.compile's default mode and overlap_comm on.
# ViT-L/14, micro-batch 256 (the preset's chunk), one process per setting group, 15 timed steps,
# with the host's time by phase: (A) ZeRO-2 and ZeRO-3 with the vitb32 preset's settings (flat
# parameters, CUDA-graphed towers, overlap_comm off), ZeRO-3 units tower and stack; (B) ZeRO-3 with
# the vitl14 preset's settings. FusedAdam is built here and comes back in $OUT/tex.tgz.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/bn; mkdir -p $R
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitl14 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower stack --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --warmup 3 --steps 15 --host_phases 5 \
    --out $R/pipeline.jsonl > $R/pipeline_vitl14_256_fast.log 2>&1
tar czf $OUT/tex.tgz .tex
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_vitl14_256_fast.log | head -20
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitl14 --micro_batch 256 \
    --zero 3 --zero3_leaf 1 --on_device_step 2 --flat_parameters 0 --impls triton --anchors \
    --compile_mode default --overlap_comm 1 --warmup 3 --steps 15 --host_phases 5 \
    --out $R/pipeline.jsonl > $R/pipeline_vitl14_256_preset.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_vitl14_256_preset.log | head -20; echo "elapsed $((SECONDS - T0)) s"
