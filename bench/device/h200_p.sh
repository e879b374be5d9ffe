# 1 x H200 (counts half): ZeRO-3 with flat parameters, the one-rank fetch kept on the device against
# DeepSpeed's own wait, in one process; the same at micro-batch 1,024 beside ZeRO-2 with the preset's
# settings.
source bench/device/env.sh
[ -d bench/device/_head/ops ] && cp bench/device/_head/ops/*.py ops/
R=/tmp/p; mkdir -p $R
timeout $(left 200) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --flat_parameters 1 --on_device_step 0 1 --impls triton --anchors --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3flat_fetch.log 2>&1
pack
timeout $(left 450) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 3 --flat_parameters 1 --impls triton --anchors torch_compile --compile_mode reduce-overhead \
    --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_1024_z3flat.log 2>&1
pack
grep -h "^throughput\|^# ZeRO" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
