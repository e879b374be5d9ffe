# 1 x H100 (counts part), issue 10 on an H100 80GB: ViT-B/32 at micro-batch 256, the preset's settings with ZeRO-2
# against the plain torch.compile'd loop (torch_compile anchor) in the same process.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/fk; mkdir -p $R
timeout $(left 500) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --impls triton --anchors torch_compile --steps 30 --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_h100.log 2>&1
pack
grep -h "^throughput\|samples/s\|MFU\|Error\|error" $R/pipeline_vitb32_256_h100.log | head -20; echo "elapsed $((SECONDS - T0)) s"
