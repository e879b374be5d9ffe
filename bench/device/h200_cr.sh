# 1 x H200 (counts part), issue 10's ZeRO-3 bar: ViT-B/32, micro-batch 256, flat parameters, towers as the
# ZeRO-3 units, CUDA-graphed stacks, the lightened step (DeepSpeed's fetch and norm waits kept), overlap_comm
# off; rows in ONE process: the torch_compile anchor, ZeRO-2, ZeRO-3 as before, ZeRO-3 with every parameter
# persistent (stage3_param_persistence_threshold 1e9: no gathers or releases; gradients and optimizer state
# still partitioned), each with the host's ms per phase.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/cr; mkdir -p $R
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --zero3_extra '{}' '{"stage3_param_persistence_threshold": 1e9}' \
    --on_device_step 2 --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --host_phases 20 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_z3_persistent_h200.log 2>&1
pack
grep -h "^throughput\|^# host ms\|samples/s\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
