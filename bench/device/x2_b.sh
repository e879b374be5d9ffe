# 2 x H200 (NVLink; counts in full): the vitb32 preset (micro-batch 1,024, ZeRO-2, gather loss) on one GPU
# and on two, now with the patch embedding as a GEMM: per-GPU scaling (x2_a.sh measured it before).
source bench/device/env.sh
R=/tmp/x2b; mkdir -p $R
S="--only throughput --throughput_model vitb32 --micro_batch 1024 --zero 2 --flat_parameters 1 --impls triton \
   --compile_mode reduce-overhead --overlap_comm 0"
CUDA_VISIBLE_DEVICES=0 timeout $(left 220) python bench/bench_pipeline.py $S --anchors --out $R/pipeline.jsonl \
    > $R/pipeline_1gpu.log 2>&1
pack
timeout $(left 470) deepspeed --num_gpus 2 bench/bench_pipeline.py $S --anchors --out $R/pipeline.jsonl \
    > $R/pipeline_2gpu.log 2>&1
pack
grep -h "^throughput" $R/*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
