# 1 x H200 (counts part): ZeRO-3 with flat towers (no DeepSpeed host waits kept) against ZeRO-2 with flat towers,
# ViT-B/32 micro-batch 256, checkpointing off, 20 timed steps a row: three processes, ZeRO-3 first in the first and
# the third (h200_hd's second process had ZeRO-3 flat towers at 0.48x there, as its second row).
source bench/device/env.sh
R=/tmp/he; mkdir -p $R
for i in 1 2 3; do
  order="3 2"; [ $i = 2 ] && order="2 3"
  timeout $(( $(left 570) / (4 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero $order --zero3_leaf tower --flat_parameters tower --grad_ckpt off --on_device_step 1 \
      --steps 20 --anchors --out $R/pipeline_vitb32_256_flat_towers_order_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_order_${i}_h200.log 2>&1
  grep -E "^throughput" $R/pipeline_vitb32_256_flat_towers_order_${i}_h200.log | sort -u
  pack
done
echo "elapsed $((SECONDS - T0)) s"
