# 1 x H200 (counts part), issue 10 / 11: is the ZeRO-3 rows' 4.03 GiB peak (h200_cd with the loss's CUDA graphs,
# h200_cr with persistent parameters, both the second ZeRO-3 row of their process) the row's place in the
# process? The same ZeRO-3 towers row twice in one process (ViT-B/32, micro-batch 256, h200_cr's settings,
# no loss graphs, no anchors), peak memory per row.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/ds; mkdir -p $R
timeout $(left 500) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf tower --zero3_extra '{}' '{}' \
    --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 20 \
    --out $R/pipeline.jsonl > $R/pipeline_vitb32_256_z3_twice_h200.log 2>&1
pack
grep -h "^throughput\|samples/s\|peak\|Error\|error" $R/pipeline_*.log | head -20; tail -3 $R/pipeline.jsonl | cut -c1-600; echo "elapsed $((SECONDS - T0)) s"
