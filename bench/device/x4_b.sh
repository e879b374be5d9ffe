# 4 x H200, call B: issue 10's 1-GPU ViT-B/32 figure (call A's timed out on the cold compile) and the
# 4-GPU row again in the same call; issue 14's ViT-B/32 scenes preset on 4 GPUs (4 x 256), with the
# held-out colour and count splits after it. (scenes_small on 4 GPUs: call A's exactness runs.)
source bench/device/env.sh
R=/tmp/b; mkdir -p $R
taskset -c 16-63 python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 \
    --workers 32 > $R/make224.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 timeout 170 taskset -c 0-15 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
    --micro_batch 1024 --zero 2 --impls triton --anchors --out $R/pipeline.jsonl > $R/pipeline_w1.log 2>&1
wait
timeout 90 deepspeed --num_gpus 4 bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --impls triton --anchors --distributed gather --out $R/pipeline.jsonl > $R/pipeline_w4.log 2>&1
pack runs/scenes_vitb32
timeout $(left 555) deepspeed --num_gpus 4 launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json \
    --set data.device_cache=true --set eval.every=500 --set train.save_every=0 > $R/vitb32_w4.log 2>&1
pack runs/scenes_vitb32
[ $(left 590) -gt 16 ] && zeroshot_splits runs/scenes_vitb32 data/scenes $R $(( $(left 590) / 2 ))
pack runs/scenes_vitb32
grep -h "samples/s" $R/pipeline_w*.log; grep -h "eval at step" $R/vitb32_w4.log | tail -3 | cut -c1-250; grep -h "done:" $R/*.log; echo "elapsed $((SECONDS - T0)) s"
