# 1 x H200 (counts half): where the ViT-B/32 step at micro-batch 256 makes the host wait for the GPU
# (sync debug mode + wrapped synchronize calls) and where its host Python time goes (cProfile),
# ZeRO-2 with flat parameters, overlap_comm on and off, beside the torch_compile anchor.
source bench/device/env.sh
R=/tmp/j; mkdir -p $R
timeout $(left 330) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors torch_compile --sync_points 3 \
    --out $R/pipeline.jsonl > $R/pipeline_256_sync.log 2>&1
pack
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 --flat_parameters 1 --impls triton --anchors --overlap_comm 0 --sync_points 3 \
    --out $R/pipeline.jsonl > $R/pipeline_256_sync_nooverlap.log 2>&1
pack
grep -h "samples/s\|# host waits" $R/pipeline_256*.log; echo "elapsed $((SECONDS - T0)) s"
