# 1 x H200 (counts part): h200_hh's slow rows (ZeRO-3 flat towers after ZeRO-3 flat blocks in one process: 2,728-3,244
# samples/s with the GPU busy 38.8 ms a step) with torch.compile's caches and the CUDA graph trees reset before
# each row, and the host time by phase; ViT-B/32 micro-batch 256, no host waits; two processes, then one without reset.
# (--reset_compiled: a bench_pipeline.py option from h200_hi to h200_hk, removed after h200_hk: with the reset the
# second compiled model of a process stayed slow too, 0.43-0.59x)
source bench/device/env.sh
R=/tmp/hi; mkdir -p $R
for i in 1 2 3; do
  reset=1; [ $i = 3 ] && reset=0
  timeout $(( $(left 570) / (4 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero 3 --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 1 \
      --anchors --reset_compiled $reset --host_phases 3 --out $R/pipeline_vitb32_256_flat_towers_reset${reset}_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_reset${reset}_${i}_h200.log 2>&1
  grep -E "^throughput|host ms" $R/pipeline_vitb32_256_flat_towers_reset${reset}_${i}_h200.log | sort -u
  pack
done
echo "elapsed $((SECONDS - T0)) s"
