# 1 x H200 (counts part): the vitb32_zero3 preset's layout at its micro-batch (1,024): ZeRO-2 with flat blocks (the
# vitb32 preset) and flat towers, ZeRO-3 with flat blocks and flat towers (tower units, no DeepSpeed host waits),
# checkpointing off, one process; then the vitb32_zero3 preset end to end (launch/pretrain.py, the training engine's
# own path) from JPEG shards on disk against its synthetic step.
source bench/device/env.sh
R=/tmp/hf; mkdir -p $R
timeout $(left 300) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
    --micro_batch 1024 --zero 2 3 --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 1 \
    --anchors --out $R/pipeline_vitb32_1024_flat_towers.jsonl > $R/pipeline_vitb32_1024_flat_towers_h200.log 2>&1
grep -E "^throughput" $R/pipeline_vitb32_1024_flat_towers_h200.log | sort -u
pack
timeout $(left 580) python bench/bench_e2e.py --preset ds_configs/vitb32_zero3.json --workers 12 --steps 60 \
    --dir /tmp/e2e --out $R/e2e_vitb32_zero3.jsonl > $R/e2e_vitb32_zero3_h200.log 2>&1
tail -3 $R/e2e_vitb32_zero3_h200.log; cp /tmp/e2e/*.log $R/ 2>/dev/null
grep -E "^throughput" /tmp/e2e/synthetic.log
pack
echo "elapsed $((SECONDS - T0)) s"
