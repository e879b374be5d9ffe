# 1 x H200 (counts half): ViT-B/32, ZeRO-2 with flat parameters, the towers replayed as CUDA graphs
# (compile_mode reduce-overhead) and overlap_comm off, beside the torch_compile anchor in the same
# process, at micro-batch 256 and 1,024; then a first try of DeepSpeed's DeepCompile for ZeRO-3 at 256.
source bench/device/env.sh
R=/tmp/m; mkdir -p $R
timeout $(left 200) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile --compile_mode reduce-overhead --overlap_comm 0 \
    --steps 20 --out $R/pipeline.jsonl > $R/pipeline_256_cudagraphs.log 2>&1
pack
timeout $(left 400) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile --compile_mode reduce-overhead --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_1024_cudagraphs.log 2>&1
pack
timeout $(left 585) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --impls triton --anchors --deepcompile \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3_deepcompile.log 2>&1
pack
grep -h "^throughput" $R/pipeline_*.log | sort -u; tail -5 $R/pipeline_256_z3_deepcompile.log; echo "elapsed $((SECONDS - T0)) s"
