# 1 x H200 (counts part): ZeRO-3 with flat towers (tower units, no DeepSpeed host waits) against ZeRO-2 with flat
# towers, ViT-B/32 micro-batch 256, checkpointing off, 20 timed steps, torch.compile's caches and CUDA graph trees
# reset before each row (bench_pipeline.py's default since h200_hi); three processes, ZeRO-3 first in the second.
# (--reset_compiled: a bench_pipeline.py option from h200_hi to h200_hk, removed after h200_hk: with the reset the
# second compiled model of a process stayed slow too, 0.43-0.59x)
source bench/device/env.sh
R=/tmp/hj; mkdir -p $R
for i in 1 2 3; do
  order="2 3"; [ $i = 2 ] && order="3 2"
  timeout $(( $(left 570) / (4 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero $order --zero3_leaf tower --flat_parameters tower --grad_ckpt off --on_device_step 1 \
      --steps 20 --anchors --out $R/pipeline_vitb32_256_flat_towers_reset_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_reset_${i}_h200.log 2>&1
  grep -E "^throughput" $R/pipeline_vitb32_256_flat_towers_reset_${i}_h200.log | sort -u
  pack
done
echo "elapsed $((SECONDS - T0)) s"
