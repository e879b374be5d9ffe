# 4 x H200, call B (issue 14): the presets on 4 GPUs from the rendered scenes: scenes_small at the
# same global batch as its 1-GPU runs (4 x 256 = 1,024), then the ViT-B/32 preset (4 x 256).
source bench/device/env.sh
T0=$SECONDS; R=/tmp/b; mkdir -p $R
left() { echo $(( $1 - (SECONDS - T0) )); }
pack() { mkdir -p $R/runs; for d in runs/scenes_small runs/scenes_vitb32; do [ -d $d ] && mkdir -p $R/$d && cp -r $d/tb $d/eval $R/$d/ 2>/dev/null; done; tar czf $OUT/b.tgz -C /tmp b; }
python launch/batch_study.py --prepare --out /tmp/unused > $R/prepare.log 2>&1 &
python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 --workers 32 > $R/make224.log 2>&1 &
wait
timeout 170 deepspeed --num_gpus 4 launch/pretrain.py --ds_config ds_configs/scenes_small.json \
    --set train_micro_batch_size_per_gpu=256 --set train.save_every=0 --set tensorboard.enabled=true \
    --set 'tensorboard.output_path="runs/scenes_small/"' --set 'tensorboard.job_name="tb"' > $R/small_w4.log 2>&1
zs() {  # held-out colour and count splits of a finished run (its exported model)
  for sp in colour count; do
    local last=$(printf %06d $(( $(ls $2/zeroshot_$sp/shard-*.tar | wc -l) - 1 )))
    timeout 60 python launch/zeroshot.py --checkpoint $1/final --shards "$2/zeroshot_$sp/shard-{000000..$last}.tar" \
        --classnames $2/zeroshot_$sp/classnames.txt --templates $2/zeroshot_$sp/templates.txt --out $1/eval/zs_$sp.json \
        > $R/zs_$(basename $1)_$sp.log 2>&1
  done
}
zs runs/scenes_small data/scenes64
pack
timeout $(left 570) deepspeed --num_gpus 4 launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json \
    --set data.device_cache=true --set eval.every=500 --set train.save_every=0 > $R/vitb32_w4.log 2>&1
pack
[ $(left 590) -gt 20 ] && zs runs/scenes_vitb32 data/scenes && pack
grep -h "eval at step" $R/*_w4.log | tail -8; grep -h "done:" $R/*_w4.log; echo "elapsed $((SECONDS - T0)) s"
