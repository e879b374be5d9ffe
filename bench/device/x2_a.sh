# 2 x H200: the ViT-B/32 preset's settings (CUDA-graphed towers, overlap_comm off, flat parameters)
# at micro-batch 1,024 per GPU, one GPU then two (gather loss): per-GPU scaling with the new preset.
source bench/device/env.sh
R=/tmp/x2a; mkdir -p $R
S="--only throughput --throughput_model vitb32 --micro_batch 1024 --zero 2 --flat_parameters 1 --impls triton \
   --compile_mode reduce-overhead --overlap_comm 0"
CUDA_VISIBLE_DEVICES=0 timeout $(left 250) python bench/bench_pipeline.py $S --anchors --out $R/pipeline.jsonl \
    > $R/pipeline_1gpu.log 2>&1
pack
timeout $(left 560) deepspeed --num_gpus 2 bench/bench_pipeline.py $S --anchors --out $R/pipeline.jsonl \
    > $R/pipeline_2gpu.log 2>&1
pack
grep -h "^throughput" $R/*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
