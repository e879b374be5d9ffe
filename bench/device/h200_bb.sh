# 1 x H200: issue 10's ZeRO-3 bar (ViT-B/32, micro-batch 256: ZeRO-3 >= 0.9x ZeRO-2, same run).
# ZeRO-2 with the preset's settings and ZeRO-3 with layer stacks, both flat parameters, CUDA-graphed
# towers, overlap_comm off, alternating in ONE process (2 3 2 3), the ZeRO-3 step lightened by
# pipeline.zero3_step now without DeepSpeed's host waits (one-rank fetch, gradient norm's -1,
# gradient epilogue) and the text tower's mask built without reading the device. --sync_points
# lists the waits left in each row (2 steps), then a host profile.
# Second call (after the first, 2 3 2 3, measured ZeRO-3 slower than earlier calls): the ZeRO-3
# rows alternate the new step (1), the lightened step with DeepSpeed's host waits (2) and with
# only the fetch's waits kept (3), after one ZeRO-2 row: --zero 2 3 --on_device_step 1 2 3 1 2.
# The first call's command: --zero 2 3 2 3 --on_device_step 1 (R=/tmp/bb).
source bench/device/env.sh
R=/tmp/bb2; mkdir -p $R
timeout $(left 395) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf stack --on_device_step 1 2 3 1 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --sync_points 2 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3waits_ablation.log 2>&1
pack
grep -h "^throughput\|Error\|lightened\|host waits" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
