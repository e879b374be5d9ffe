# 1 x H200 (a one-GPU machine counts half): issue 10's open bars at micro-batch 256, ViT-B/32,
# beside the torch_compile anchor in the same process: ZeRO-2 with and without
# model.flat_parameters (profiled: where the step's host time goes), ZeRO-3; then ZeRO-3 with
# larger parameter-persistence thresholds (fewer gathered tensors) against ZeRO-2 again.
source bench/device/env.sh
R=/tmp/f; mkdir -p $R
timeout 400 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --flat_parameters 0 1 --impls triton --anchors torch_compile --profile 2 \
    --out $R/pipeline.jsonl > $R/pipeline_256.log 2>&1
pack
for t in 1000000:470 4000000:570; do
  timeout $(left ${t#*:}) python bench/bench_pipeline.py --only throughput \
      --throughput_model vitb32 --micro_batch 256 --zero 3 --impls triton --anchors \
      --zero3_extra "{\"stage3_param_persistence_threshold\": ${t%:*}}" --out $R/pipeline.jsonl > $R/pipeline_256_z3_${t%:*}.log 2>&1
  pack
done
grep -h "samples/s\|MFU" $R/pipeline_256*.log | grep -v "^ " | head -20; echo "elapsed $((SECONDS - T0)) s"
