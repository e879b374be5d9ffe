# 1 x H200, call E (issue 14): the ViT-B/32 scenes preset, all 3,000 steps on one GPU (the training
# set in GPU memory; evaluation every 500 steps), then the held-out colour and count splits.
source bench/device/env.sh
R=/tmp/e; mkdir -p $R
python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 \
    --workers 16 > $R/make224.log 2>&1
timeout $(left 490) python launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json \
    --set data.device_cache=true --set data.workers=15 --set eval.every=500 --set train.save_every=0 > $R/vitb32_w1.log 2>&1
pack runs/scenes_vitb32
[ $(left 530) -gt 16 ] && zeroshot_splits runs/scenes_vitb32 data/scenes $R $(( $(left 530) / 2 ))
pack runs/scenes_vitb32
grep -h "eval at step" $R/vitb32_w1.log | cut -c1-220; grep -h "done:" $R/*.log; echo "elapsed $((SECONDS - T0)) s"
