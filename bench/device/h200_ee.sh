# 1 x H200 (counts part), issue 10's ZeRO-3 bar: ViT-B/32, micro-batch 256, flat parameters, towers as the
# ZeRO-3 units, CUDA-graphed stacks, overlap_comm off. The lightened step with the gradient bucket's stream
# handoff skipped, DeepSpeed's NVTX ranges off and no redundant view binding (--on_device_step 2, what
# training builds) against the step before (4: DeepSpeed's bucketing and NVTX kept), alternating in one
# process after a ZeRO-2 row; a second process attributes the two pieces (5: NVTX kept, 6: bucketing kept).
# At most four ZeRO-3 rows a process (each destroyed engine leaves ~2.3 GiB behind).
# Result (2026-11-24, sixth session): no measurable gain (ZeRO-3 rows 3,777-4,400 samples/s whatever the
# variant, backward host ms 30.0 against 30.2); the bucket and NVTX replacements were not committed, so
# --on_device_step 4-6 no longer exist. The view-binding skip stayed (pipeline/flat_params.bind_views).
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/ee; mkdir -p $R
timeout 150 python -m pytest -q -p no:warnings -p no:cacheprovider tests/pipeline/test_zero3_step.py -k "cuda or bucket or nvtx" \
    > $R/gpu_tests_zero3_bucket.log 2>&1; tail -3 $R/gpu_tests_zero3_bucket.log
common="--only throughput --throughput_model vitb32 --micro_batch 256 --zero 2 3 --zero3_leaf tower \
    --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --host_phases 20"
timeout $(left 400) python bench/bench_pipeline.py $common --on_device_step 4 2 4 2 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_z3_buckets_nvtx_ab_h200.log 2>&1
pack
timeout $(left 570) python bench/bench_pipeline.py $common --on_device_step 5 6 2 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_z3_buckets_nvtx_split_h200.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
