# 1 x H200 (counts part): h200_bz again after the fix of keep_step_on_device (it refused every ZeRO-1/2
# engine after the first of a process, so the second ZeRO-2 row of h200_bz ran DeepSpeed's host waits),
# with the loss's captures and replays counted: the loss's CUDA-graph replay inside training. ViT-B/32, micro-batch 256,
# flat parameters, CUDA-graphed stacks, overlap_comm off, ZeRO-2 and ZeRO-3 (towers as units), each
# with contrastive_loss.graph_max_batch 0 (eager) and 8,192 (the default), rows in one process, the
# host's time by phase after the timed steps.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/cd; mkdir -p $R
timeout $(left 540) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --host_phases 20 --loss_graph_max_batch 0 8192 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_loss_graphs_fixed.log 2>&1
pack
grep -h "^throughput\|^# host ms\|^# loss CUDA\|^# ZeRO\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
