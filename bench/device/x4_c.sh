# 4 x H200 (not yet run: the 4-GPU kind was not lent again after call B): the ViT-B/32 scenes preset
# on 4 GPUs (4 x 256), all 3,000 steps with an evaluation every 500, then the held-out colour and
# count splits. ~8 minutes: BPE ~45 s, training set into GPU memory ~30 s, compile ~60 s,
# 3,000 steps at ~9,500 samples/s ~330 s.
source bench/device/env.sh
R=/tmp/c; mkdir -p $R
python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 \
    --workers 32 > $R/make224.log 2>&1
timeout $(left 540) deepspeed --num_gpus 4 launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json \
    --set data.device_cache=true --set data.workers=15 --set eval.every=500 --set train.save_every=0 > $R/vitb32_w4.log 2>&1
pack runs/scenes_vitb32
[ $(left 585) -gt 16 ] && zeroshot_splits runs/scenes_vitb32 data/scenes $R $(( $(left 585) / 2 ))
pack runs/scenes_vitb32
grep -h "eval at step" $R/vitb32_w4.log | cut -c1-200; grep -h "done:" $R/*.log; echo "elapsed $((SECONDS - T0)) s"
