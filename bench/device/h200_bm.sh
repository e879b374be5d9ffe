# 1 x H200 (counts part): issue 10's ZeRO-3 gap, by phase. ViT-B/32, micro-batch 256, flat
# parameters, CUDA-graphed stacks, overlap_comm off, the engine's ZeRO-3 defaults (lightened, the
# kept waits), rows in ONE process: ZeRO-2, ZeRO-3 towers, ZeRO-3 stacks; each with the host's
# milliseconds per step inside the engine's forward, backward and step (--host_phases, no
# synchronisation added) after the timed steps. FusedAdam is built here on first use.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/bm; mkdir -p $R
timeout $(left 540) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --zero3_leaf tower stack --on_device_step 2 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --steps 30 --host_phases 20 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3_host_phases.log 2>&1
pack
grep -h "^throughput\|^# host ms\|Error\|error" $R/pipeline_*.log | head -30; echo "elapsed $((SECONDS - T0)) s"
