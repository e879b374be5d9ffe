# 4 x H200, call C (issue 14): the ViT-B/32 scenes preset on 4 GPUs (4 x 256; 1,000 of its 3,000
# steps: the device time left), then one-GPU references of the exactness runs at lr 5e-4 (naive,
# triton, naive_seed1; the 4-rank runs were call A) beside one point of the constant-lr control.
source bench/device/env.sh
T0=$SECONDS; R=/tmp/c; mkdir -p $R
left() { echo $(( $1 - (SECONDS - T0) )); }
pack() { d=runs/scenes_vitb32; [ -d $d ] && mkdir -p $R/$d && cp -r $d/tb $d/eval $R/$d/ 2>/dev/null; tar czf $OUT/c.tgz -C /tmp c; }
taskset -c 32-63 python launch/batch_study.py --prepare --out /tmp/unused > $R/prepare.log 2>&1 &
PREP=$!
taskset -c 0-31 python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 \
    --workers 32 > $R/make224.log 2>&1
timeout $(left 340) deepspeed --num_gpus 4 launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json \
    --set data.device_cache=true --set data.workers=15 --set train.steps=1000 --set scheduler.params.total_num_steps=1000 \
    --set eval.every=500 --set train.save_every=0 > $R/vitb32_w4.log 2>&1
pack; wait $PREP
( for sp in colour count; do
    CUDA_VISIBLE_DEVICES=3 timeout 40 python launch/zeroshot.py --checkpoint runs/scenes_vitb32/final \
        --shards "data/scenes/zeroshot_$sp/shard-{000000..000001}.tar" --classnames data/scenes/zeroshot_$sp/classnames.txt \
        --templates data/scenes/zeroshot_$sp/templates.txt --out runs/scenes_vitb32/eval/zs_$sp.json > $R/zs_$sp.log 2>&1
  done
  CUDA_VISIBLE_DEVICES=3 timeout $(left 455) python launch/batch_study.py --loader-workers 15 --lr-rule constant \
      --batches 16384 --seeds 0 --out $R/study_constant --run-dir runs/constant > $R/constant.log 2>&1 ) &
for k in 0 1 2; do
  v=(naive triton naive_seed1)
  CUDA_VISIBLE_DEVICES=$k timeout $(left 440) python bench/bench_exactness.py --out $R/w1_${v[$k]}.json \
      --variants ${v[$k]} --run-dir runs/exactness_$k > $R/w1_${v[$k]}.log 2>&1 &
done
wait
pack
grep -h "eval at step" $R/vitb32_w4.log | cut -c1-200; grep -h "done:" $R/*.log; grep -h "batch_study: b" $R/constant*.log | grep loss
echo "elapsed $((SECONDS - T0)) s"
