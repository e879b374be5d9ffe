# 1 x H200 (counts part): where ZeRO-3's extra host time goes on the device's own host: ViT-B/32 at
# micro-batch 256, CUDA-graphed stacks, ZeRO-2 and ZeRO-3 (towers), one process, host waits and
# the host's Python profile over 3 steps (--sync_points 3).
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/cg; mkdir -p $R
timeout $(left 400) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 20 --host_phases 10 --sync_points 3 --loss_graph_max_batch 0 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_z2z3_host_profile.log 2>&1
pack
grep -h "^throughput\|^# host ms\|^# host waits\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
