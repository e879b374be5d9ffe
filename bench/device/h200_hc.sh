# 1 x H200 (counts part): ZeRO-3 with flat towers as its units, which of DeepSpeed's host waits to keep
# (on_device_step 1: none, 2: fetch and norm (the engine's default), 3: fetch), against ZeRO-2 with flat towers,
# ViT-B/32 micro-batch 256, checkpointing off; host time by phase and the host waits left; two processes.
source bench/device/env.sh
R=/tmp/hc; mkdir -p $R
for i in 1 2; do
  timeout $(( $(left 560) / (3 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero 2 3 --zero3_leaf tower --flat_parameters tower --grad_ckpt off --on_device_step 1 2 3 \
      --anchors --host_phases 3 --sync_points $((i - 1)) --out $R/pipeline_vitb32_256_flat_towers_waits_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_waits_${i}_h200.log 2>&1
  grep -E "^throughput|host ms" $R/pipeline_vitb32_256_flat_towers_waits_${i}_h200.log | sort -u
  pack
done
echo "elapsed $((SECONDS - T0)) s"
