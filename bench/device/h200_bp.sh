# 1 x H200 (counts part): issue 10's "every preset and ZeRO 0-3": ViT-B/32 at micro-batch 256 under
# ZeRO-0, 1 and 2 in one process (flat parameters, CUDA-graphed towers, overlap_comm off: the vitb32
# preset's settings), then ViT-B/16 at 256 under ZeRO-2 and ZeRO-3 with whole towers as units, each
# with the host's time by phase. FusedAdam from .tex.
source bench/device/env.sh
R=/tmp/bp; mkdir -p $R
timeout $(left 280) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 0 1 2 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead --overlap_comm 0 \
    --warmup 3 --steps 30 --host_phases 10 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_zero012.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_vitb32_256_zero012.log | head -12
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb16 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --warmup 3 --steps 20 --host_phases 10 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb16_256_z2z3.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_vitb16_256_z2z3.log | head -12; echo "elapsed $((SECONDS - T0)) s"
