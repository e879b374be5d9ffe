# 1 x H200 (counts part), issue 11: the README's loss table with the 64 x 256 Gluon tiles (h200_es), behind 20 ms of
# queued work, the op with the 64 x 128 tiles as a variant row (ours_bf16_narrow) in the same process.
source bench/device/env.sh
R=/tmp/et; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    --variant "narrow:_GLUON={'on': True, 'tiles': (64, 128, 64, 6, 128)}" \
    > $R/contrastive_loss_h200_wide_queued20.log 2>&1
grep "^|\|^#" $R/contrastive_loss_h200_wide_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
