# 1 x H200 (counts half): the loss op with the fused kernels up to B = 16k (issue 11's table from
# the committed defaults), then issue 10 at micro-batch 256 beside the torch_compile anchor:
# ZeRO-2 with and without model.flat_parameters (members bound by one split), ZeRO-3 with the
# compile defaults (memory_efficient_linear false) and with memory_efficient_linear true.
source bench/device/env.sh
R=/tmp/h; mkdir -p $R
timeout 150 python bench/bench_contrastive_loss.py --big "" --anchors compiled_dense,dense_siglip \
    --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
grep "^|" $R/contrastive_loss.log | grep -v banded
pack
timeout $(left 450) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --flat_parameters 0 1 --impls triton --anchors torch_compile --profile 2 \
    --out $R/pipeline.jsonl > $R/pipeline_256.log 2>&1
pack
timeout $(left 570) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --impls triton --anchors --zero3_extra '{"memory_efficient_linear": true}' \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3_mel.log 2>&1
pack
grep -h "samples/s\|# profile" $R/pipeline_256*.log; grep -c recompile_limit $R/pipeline_256*.log; echo "elapsed $((SECONDS - T0)) s"
