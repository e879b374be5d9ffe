# 1 x H200 (counts half): the patch embedding as one GEMM against the convolution on the other
# presets' towers: ViT-B/16 at micro-batch 256 (ZeRO-2 with the vitb32 preset's fast settings,
# next to the torch_compile anchor), then ViT-L/14 at micro-batch 256 (ZeRO-2, no chunking).
source bench/device/env.sh
R=/tmp/w; mkdir -p $R
timeout $(left 280) python bench/bench_pipeline.py --only throughput --throughput_model vitb16 --micro_batch 256 \
    --zero 2 --patch_embedding gemm conv --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_vitb16_256_patchgemm.log 2>&1
pack
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitl14 --micro_batch 256 \
    --zero 2 --patch_embedding gemm conv --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_vitl14_256_patchgemm.log 2>&1
pack
grep -h "^throughput\|Error" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
