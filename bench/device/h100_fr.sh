# 1 x H100 (counts part), issue 11: the Gluon forward sums' launches of at most 2^33 logits and rotated row tiles
# (launches of at most 32 items a program) were chosen on an H200 (h200_hw / h200_hx); the same comparisons on an
# H100 80GB, then the op behind 20 ms queued at 16k-262k with the compiled dense loss and, as a variant, the
# sums as before (one launch, in order).
source bench/device/env.sh
R=/tmp/fr; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 --reps 5 --rotate 0 1 \
    > $R/gluon_sums_rotate_fr_h100.log 2>&1
grep "TFLOP" $R/gluon_sums_rotate_fr_h100.log
timeout $(left 300) python bench/diag_gluon_sums.py --sizes 131072,262144 --reps 3 --launch-logits 0 8589934592 \
    > $R/gluon_sums_slabs_fr_h100.log 2>&1
grep "TFLOP" $R/gluon_sums_slabs_fr_h100.log
pack
S='_GLUON_SUMS={"on":True,"tiles":(64,128,64,4,32),"launch":"clip_sums","kw":'
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big 131072,262144 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h100_sums_launches.jsonl \
    --variant "before:${S}{\"launch_logits\":0,\"rotate\":False}}" \
    > $R/contrastive_loss_h100_sums_launches_queued20.log 2>&1
tail -22 $R/contrastive_loss_h100_sums_launches_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
