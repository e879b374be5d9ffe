# 1 x H200 (counts half): the ViT-B/32 preset as it now stands (CUDA-graphed towers, overlap_comm off,
# flat parameters, the engine's defaults) end to end through launch/pretrain.py from rendered JPEG
# shards on disk, against the same preset on synthetic batches; then DeepCompile for ZeRO-3 without
# leaf layers (a second try) with what time is left.
source bench/device/env.sh
R=/tmp/n; mkdir -p $R
timeout $(left 470) python bench/bench_e2e.py --preset ds_configs/vitb32.json --workers 12 --steps 60 --dir /tmp/e2e \
    --out $R/e2e.jsonl > $R/e2e.log 2>&1
cp /tmp/e2e/*.log $R/ 2>/dev/null; pack
timeout $(left 585) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf 0 --impls triton --anchors --deepcompile \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3_deepcompile.log 2>&1
pack
tail -3 $R/e2e.log; grep -h "^throughput" $R/*.log | sort -u; tail -4 $R/pipeline_256_z3_deepcompile.log; echo "elapsed $((SECONDS - T0)) s"
