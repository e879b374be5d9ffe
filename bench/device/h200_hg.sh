# 1 x H200 (counts part): h200_hd's outlier again (ZeRO-3 flat towers at 0.48x ZeRO-2 as the second row of a process
# whose first row was ZeRO-3 with flat blocks): the same order in two processes, ViT-B/32 micro-batch 256,
# checkpointing off, no DeepSpeed host waits, with each row's host waits and host profile after its timed steps.
source bench/device/env.sh
R=/tmp/hg; mkdir -p $R
for i in 1 2; do
  timeout $(( $(left 570) / (3 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero 3 2 --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 1 \
      --anchors --sync_points 2 --out $R/pipeline_vitb32_256_flat_towers_z3first_$i.jsonl \
      > $R/pipeline_vitb32_256_flat_towers_z3first_${i}_h200.log 2>&1
  grep -E "^throughput" $R/pipeline_vitb32_256_flat_towers_z3first_${i}_h200.log | sort -u
  grep -E "host waits for the GPU" $R/pipeline_vitb32_256_flat_towers_z3first_${i}_h200.log
  pack
done
echo "elapsed $((SECONDS - T0)) s"
