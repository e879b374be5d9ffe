# 1 x H200 (counts part), issue 11: the op with the Gluon sums kernel (chunks of 32) on an idle GPU at 32k / 65k, its
# CLIP and SigLIP against the compiled dense losses in 60 interleaved rounds (as h200_ep).
source bench/device/env.sh
R=/tmp/fx; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --interleave 60 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_gluon_sums_idle_32k_65k.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_gluon_sums_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
