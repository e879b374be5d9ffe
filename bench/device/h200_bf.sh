# 1 x H200 (counts part): issue 10's ZeRO-3 bar with whole towers as ZeRO-3 units
# (model.zero3_leaf_layers "tower", pipeline/tower_unit.py: DeepSpeed's hooks on 3 modules instead
# of 20). ViT-B/32, micro-batch 256, flat parameters, CUDA-graphed stacks, overlap_comm off, the
# ZeRO-3 step lightened with DeepSpeed's host waits kept (the engine's default); rows in ONE
# process, alternating: ZeRO-2, ZeRO-3 stacks, ZeRO-3 towers, twice. FusedAdam is built here on
# first use and comes back in $OUT/tex.tgz for later calls.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/bf; mkdir -p $R
timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 2 3 --zero3_leaf stack tower --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3tower.log 2>&1
tar czf $OUT/tex.tgz .tex
pack
grep -h "^throughput\|Error\|error\|lightened" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
