# 1 x H200 (counts part): why the loss's CUDA-graph replay slows a ViT-B/32 step with CUDA-graphed
# towers (h200_bz): ZeRO-2 at micro-batch 256, reduce-overhead, loss graphs 0 / 8,192, the
# captures and replays counted, the host's waits and its Python profile over 3 steps.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/cc; mkdir -p $R
timeout $(left 400) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 20 --host_phases 10 --sync_points 3 --loss_graph_max_batch 0 8192 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_loss_graphs_profile.log 2>&1
pack
grep -h "^throughput\|^# host ms\|^# loss CUDA\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
