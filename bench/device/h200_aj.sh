# 1 x H200 (counts half): the loss op against the compiled dense anchors with 20 ms of GPU work
# queued before each timed call (as in training, behind the towers' forward), then on an idle GPU
# as before; each in one process with its anchors.
source bench/device/env.sh
R=/tmp/aj; mkdir -p $R
for q in 20 0; do
  timeout $(left 290) python bench/bench_contrastive_loss.py --big "" --reps 7 --anchors compiled_dense,dense_siglip \
      --queued-ms $q --out $R/contrastive_loss.jsonl > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log; done; echo "elapsed $((SECONDS - T0)) s"
