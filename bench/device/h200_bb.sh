# 1 x H200: issue 10's ZeRO-3 bar (ViT-B/32, micro-batch 256: ZeRO-3 >= 0.9x ZeRO-2, same run).
# ZeRO-2 with the preset's settings and ZeRO-3 with layer stacks, both flat parameters, CUDA-graphed
# towers, overlap_comm off, alternating in ONE process (2 3 2 3), the ZeRO-3 step lightened by
# pipeline.zero3_step now without DeepSpeed's host waits (one-rank fetch, gradient norm's -1,
# gradient epilogue) and the text tower's mask built without reading the device. --sync_points
# lists the waits left in each row (2 steps), then a host profile.
source bench/device/env.sh
R=/tmp/bb; mkdir -p $R
timeout $(left 540) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 2 3 --zero3_leaf stack --on_device_step 1 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --sync_points 2 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z2z3_nowaits.log 2>&1
pack
grep -h "^throughput\|Error\|lightened\|host waits" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
