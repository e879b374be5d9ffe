# 2 x H200: the batch-size study (launch/batch_study.py defaults), one process per GPU, resumable:
# results of earlier calls in bench/results/batch_study/ are copied in first and skipped.
source bench/device/env.sh
mkdir -p $OUT/batch_study && cp -r bench/results/batch_study/. $OUT/batch_study/ 2>/dev/null
python launch/batch_study.py --prepare --out $OUT/batch_study > $OUT/prepare.log 2>&1
for k in 0 1; do
  CUDA_VISIBLE_DEVICES=$k timeout ${STUDY_S:-540} python launch/batch_study.py --part $k/2 --loader-workers 15 \
      --out $OUT/batch_study > $OUT/part$k.log 2>&1 &
done
wait
grep -h "batch_study: b" $OUT/part*.log | grep loss
