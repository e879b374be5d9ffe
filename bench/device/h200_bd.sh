# 1 x H200 (counts half): the op before the one-assembly refactor (commit ca1fecf, carried as .old/)
# and after it, alternating process by process on the same GPU (old, new, old, new): each call on
# an idle GPU at B = 1k-8k (where the host sets the time), then behind 20 ms of queued work at
# 32k / 65k. No anchors: the ratio old / new is the measurement.
source bench/device/env.sh
R=/tmp/bd; mkdir -p $R
run() {  # run TREE LABEL SIZES QUEUED
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout $(left 540) python bench/bench_contrastive_loss.py \
      --sizes $3 --big "" --reps 9 --anchors "" --queued-ms $4 --out $R/$2.jsonl >> $R/$2.log 2>&1)
}
for round in 1 2; do
  run .old old 1024,2048,4096,8192 0; run . new 1024,2048,4096,8192 0
done
for round in 1 2; do
  run .old old 32768,65536 20; run . new 32768,65536 20
done
pack
for t in old new; do echo "== $t"; grep "^| [0-9]" $R/$t.log; done
echo "elapsed $((SECONDS - T0)) s"
