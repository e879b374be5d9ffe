# 1 x H200 (counts part): where h200_hd / h200_hg's slow rows go (ZeRO-3 flat towers at ~0.5x ZeRO-2 as the second
# row of a process after ZeRO-3 with flat blocks: the same host profile, the step waits on the GPU): ZeRO-3 flat
# blocks then flat towers, ViT-B/32 micro-batch 256, no host waits, with a torch profile (GPU busy time and kernel
# table) after each row's timed steps; three processes.
source bench/device/env.sh
R=/tmp/hh; mkdir -p $R
for i in 1 2 3; do
  timeout $(( $(left 570) / (4 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero 3 --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 1 \
      --anchors --profile 3 --out $R/pipeline_vitb32_256_flat_towers_z3profile_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_z3profile_${i}_h200.log 2>&1
  grep -E "^throughput|device busy" $R/pipeline_vitb32_256_flat_towers_z3profile_${i}_h200.log
  pack
done
echo "elapsed $((SECONDS - T0)) s"
