# 1 x H200 (counts half): the patch embedding as one GEMM (model.patch_embedding "gemm", now the
# default) against transformers' strided convolution ("conv"), ZeRO-2 with the preset's settings,
# next to the torch_compile anchor, micro-batch 256 (and ZeRO-3 with layer stacks) and 1,024;
# then a profile of the gemm row at 256 (what the step's GPU time is now spent on).
source bench/device/env.sh
R=/tmp/v; mkdir -p $R
timeout $(left 250) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --patch_embedding gemm conv --flat_parameters 1 --impls triton --anchors torch_compile \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_1024_patchgemm.log 2>&1
pack
timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf stack --patch_embedding gemm conv --flat_parameters 1 --impls triton \
    --anchors torch_compile --compile_mode reduce-overhead --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_patchgemm.log 2>&1
pack
grep -h "^throughput\|Error" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
