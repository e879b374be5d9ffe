# 1 x H200 (counts part): with whole towers as ZeRO-3 units the step's GPU work equals ZeRO-2's
# (39.9 against 38.9 ms busy per step, h200_bg) and the rest is host time and ~10 host waits per
# step. Which of DeepSpeed's waits to keep, again, now with towers: ZeRO-3 rows without them (1),
# with the fetch and norm waits (2, the engine's default) and with the fetch waits only (3),
# alternating twice in ONE process after a ZeRO-2 row (ViT-B/32, micro-batch 256, as h200_bf).
source bench/device/env.sh
R=/tmp/bh; mkdir -p $R
timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower --on_device_step 1 2 3 1 2 3 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3tower_waits.log 2>&1
pack
grep -h "^throughput\|Error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
