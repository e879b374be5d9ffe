# 1 x H200 (counts part), issue 11: the README's loss table again with the code as it stands (the Gluon sums' launches
# and rotated rows, h200_hx / h200_hy): the op, CLIP and SigLIP, against the compiled dense losses behind 20 ms of
# queued work at 1k-65k, then on an idle GPU at 1k-16k in 60 interleaved rounds with the eager op (as h200_gf).
source bench/device/env.sh
R=/tmp/ic; mkdir -p $R
timeout $(left 250) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    > $R/contrastive_loss_h200_table_ic_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_table_ic_queued20.log
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" \
    --reps 9 --anchors compiled_dense,dense_siglip --eager --interleave 60 --interleave-max 16384 \
    --out $R/contrastive_loss_idle.jsonl > $R/contrastive_loss_h200_table_ic_idle_1k_16k.log 2>&1
grep "^# interleaved" $R/contrastive_loss_h200_table_ic_idle_1k_16k.log
pack
echo "elapsed $((SECONDS - T0)) s"
