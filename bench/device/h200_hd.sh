# 1 x H200 (counts part): ZeRO-3 with flat towers as its units and none of DeepSpeed's host waits kept but the
# optimizer's own overflow read, against ZeRO-2 with flat blocks (the vitb32 preset's layout) and with flat towers,
# ViT-B/32 micro-batch 256, checkpointing off: three processes, ZeRO-3's rows first in the second.
source bench/device/env.sh
R=/tmp/hd; mkdir -p $R
for i in 1 2 3; do
  order="2 3"; [ $i = 2 ] && order="3 2"
  timeout $(( $(left 570) / (4 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero $order --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 1 \
      --anchors --out $R/pipeline_vitb32_256_flat_towers_nowaits_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_nowaits_${i}_h200.log 2>&1
  grep -E "^throughput" $R/pipeline_vitb32_256_flat_towers_nowaits_${i}_h200.log | sort -u
  pack
done
echo "elapsed $((SECONDS - T0)) s"
