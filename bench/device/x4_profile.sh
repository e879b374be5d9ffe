# 4 x H200 (not yet run): where the ring's time goes at B = 65,536 (issue 11: 59% scaling against
# disco's 84%), and ZeRO-2/3's step at micro-batch 256 on one of the GPUs (issue 10), with and
# without model.flat_parameters, beside the torch_compile anchor, as torch.profiler tables. ~5 minutes.
source bench/device/env.sh
torchrun --nproc_per_node 4 bench/bench_distributed.py --batches 32768 65536 --schemes ring disco --profile 3 \
    --out /tmp/profile.jsonl > $OUT/profile_ring_x4.log 2>&1
CUDA_VISIBLE_DEVICES=0 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --flat_parameters 0 1 --impls triton --anchors torch_compile --profile 3 --out /tmp/pipeline.jsonl \
    > $OUT/profile_zero_256.log 2>&1
grep -h "^# profile" $OUT/*.log
