# 1 x H200 (counts part), issue 11: the Gluon forward sums' item order (h200_hu: rotated row tiles 624 against 569
# TFLOP/s at 32k, the same at 65k, slower at 262k; groups of 264 column blocks 489 against 465 at 262k). Again, with
# 131k, five replays each; then the op, forward + backward behind 20 ms queued, with each order as a variant.
# (Ran with a `group` argument of gluon_kernels.clip_sums and `--groups` of bench/diag_gluon_sums.py, items in groups
# of column blocks; measured slower or small, removed before the commit: docs/benchmark_history.md, "seventeenth session".)
source bench/device/env.sh
R=/tmp/hv; mkdir -p $R
timeout $(left 200) python bench/diag_gluon_sums.py --sizes 32768,131072,262144 --reps 5 \
    --groups 0 264 --rotate 0 1 > $R/gluon_sums_order_hv_h200.log 2>&1
cat $R/gluon_sums_order_hv_h200.log
pack
S='_GLUON_SUMS={"on":True,"tiles":(64,128,64,4,32),"launch":"clip_sums","kw":'
timeout $(left 520) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big 131072,262144 --anchors compiled_dense \
    --anchor-max 65536 --queued-ms 20 --out $R/contrastive_loss_h200_sums_order.jsonl \
    --variant "rotated:${S}{\"rotate\":True}}" --variant "group264:${S}{\"group\":264}}" \
    > $R/contrastive_loss_h200_sums_order_queued20.log 2>&1
tail -40 $R/contrastive_loss_h200_sums_order_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
