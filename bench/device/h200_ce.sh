# 1 x H200 (counts part): the loss replaying its CUDA graphs whether or not its stream is idle
# (bench_pipeline.py --loss_graph_always), ViT-B/32 at micro-batch 256, the preset's CUDA-graphed
# towers, ZeRO-2 and ZeRO-3 (towers), loss graphs 0 / 8,192, one process, host time by phase.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/ce; mkdir -p $R
timeout $(left 540) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --host_phases 20 --loss_graph_max_batch 0 8192 \
    --loss_graph_always --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_loss_graphs_always.log 2>&1
pack
grep -h "^throughput\|^# host ms\|^# loss CUDA\|^# ZeRO\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
