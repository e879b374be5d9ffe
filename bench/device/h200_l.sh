# 1 x H200 (counts half): the loss op at small B after autograd stopped zero-filling gradients for
# its saved outputs (with a host profile at B = 1,024); then ViT-B/32 at micro-batch 256, ZeRO-2
# with flat parameters (members bound straight into __dict__), beside the torch_compile anchor,
# with compile_mode default and reduce-overhead (CUDA graphs), overlap_comm on and off.
source bench/device/env.sh
R=/tmp/l; mkdir -p $R
timeout 120 python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" \
    --anchors compiled_dense,dense_siglip --host-profile 1024 --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile \
    --out $R/pipeline.jsonl > $R/pipeline_256_default.log 2>&1
pack
timeout $(left 450) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead \
    --out $R/pipeline.jsonl > $R/pipeline_256_cudagraphs.log 2>&1
pack
timeout $(left 570) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_cudagraphs_nooverlap.log 2>&1
pack
grep "^|" $R/contrastive_loss.log; grep -h "^throughput" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
