# 1 x H200 (counts part): is the slowdown of h200_bz (the loss's CUDA-graph replay inside a training
# step) an interaction with the CUDA-graph trees of the compiled towers? The same rows with
# compile_mode "default" (compiled towers, no CUDA graphs): ZeRO-2 and ZeRO-3 towers, loss graphs
# 0 / 8,192, one process, host time by phase.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/cb; mkdir -p $R
timeout $(left 540) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode default --overlap_comm 0 --steps 30 --host_phases 20 --loss_graph_max_batch 0 8192 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_loss_graphs_nocudagraphs.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
