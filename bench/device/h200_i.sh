# 1 x H200 (counts half): model.flat_parameters at the ViT-B/32 preset's micro-batch (1,024, ZeRO-2)
# beside the torch_compile anchor at 1,024 (does the preset gain from it, as micro-batch 256 does?)
source bench/device/env.sh
R=/tmp/i; mkdir -p $R
timeout 500 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --flat_parameters 0 1 --impls triton --anchors torch_compile \
    --out $R/pipeline.jsonl > $R/pipeline_1024.log 2>&1
pack
grep -h "samples/s" $R/pipeline_1024.log; echo "elapsed $((SECONDS - T0)) s"
