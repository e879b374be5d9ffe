# 1 x H200 (counts part), issue 11: the README's loss table with the Gluon gradient blocks (a11e612): the op
# against the compiled dense losses 1k-65k behind 20 ms of queued work, then on an idle GPU, one process each.
source bench/device/env.sh
R=/tmp/dr; mkdir -p $R
timeout $(left 270) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    > $R/contrastive_loss_h200_gluon_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_gluon_queued20.log
pack
timeout $(left 520) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_gluon_idle.log 2>&1
grep "^|" $R/contrastive_loss_h200_gluon_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
