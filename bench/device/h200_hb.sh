# 1 x H200 (counts part): flat towers (model.flat_parameters "tower": each tower's weights in two tensors, one unit
# under ZeRO-3, one compiled graph with CUDA graphs) against flat blocks, ZeRO-2 and ZeRO-3 tower units, ViT-B/32 at
# micro-batch 256, checkpointing off, in one process; then the same four rows again in a second process.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/hb; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
for i in 1 2; do
  timeout $(( $(left 560) / (3 - i) )) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
      --micro_batch 256 --zero 2 3 --zero3_leaf tower --flat_parameters 1 tower --grad_ckpt off --on_device_step 2 \
      --anchors --host_phases 3 --out $R/pipeline_vitb32_256_flat_towers_$i.jsonl > $R/pipeline_vitb32_256_flat_towers_${i}_h200.log 2>&1
  grep -E "^throughput|host ms" $R/pipeline_vitb32_256_flat_towers_${i}_h200.log
  pack
done
tar czf $OUT/tex.tgz .tex
echo "elapsed $((SECONDS - T0)) s"
