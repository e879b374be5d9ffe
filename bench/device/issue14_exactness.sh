# 2 x H200: training-level exactness (bench/bench_exactness.py) over 2 ranks and on one GPU, then a
# constant-lr control of the study at 16k and 64k. Results go back as one tar per phase.
source bench/device/env.sh
python launch/batch_study.py --prepare --out /tmp/unused > $OUT/prepare.log 2>&1
mkdir -p /tmp/r
timeout 230 deepspeed --num_gpus 2 bench/bench_exactness.py --out /tmp/r/w2.json \
    --variants gather disco ring hierarchical_ring hierarchical_ring_2x1 > /tmp/r/w2.log 2>&1
( CUDA_VISIBLE_DEVICES=0 timeout 130 python bench/bench_exactness.py --out /tmp/r/w1a.json --variants naive naive_seed1 > /tmp/r/w1a.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 130 python bench/bench_exactness.py --out /tmp/r/w1b.json --variants triton > /tmp/r/w1b.log 2>&1 ) &
wait
tar czf $OUT/exactness.tgz -C /tmp r
mkdir -p /tmp/c
for k in 0 1; do
  CUDA_VISIBLE_DEVICES=$k timeout 110 python launch/batch_study.py --part $k/2 --loader-workers 15 --lr-rule constant \
      --batches 16384 65536 --seeds 0 --out /tmp/c/study_constant --run-dir runs/constant > /tmp/c/part$k.log 2>&1 &
done
wait
tar czf $OUT/constant.tgz -C /tmp c
python bench/bench_exactness.py --compare /tmp/r/w1a.json /tmp/r/w1b.json /tmp/r/w2.json
grep -h "batch_study: b" /tmp/c/part*.log | grep loss
