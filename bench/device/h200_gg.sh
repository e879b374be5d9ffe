# 1 x H200 (counts part), issue 11: bench/diag_gluon_grad.py --siglip (the committed diag of the SigLIP block, Triton
# against Gluon, P and row sums checked); the op on an idle GPU at 32k / 65k again (h200_gd: SigLIP 0.91x / 0.85x,
# CLIP 0.92x / 0.90x the dense losses in 40 interleaved rounds), 60 rounds.
source bench/device/env.sh
R=/tmp/gg; mkdir -p $R
timeout $(left 90) python bench/diag_gluon_grad.py --siglip > $R/gluon_grad_siglip_h200.log 2>&1
cat $R/gluon_grad_siglip_h200.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --interleave 60 --interleave-max 65536 --out $R/idle.jsonl \
    > $R/contrastive_loss_h200_gluon_siglip_idle_32k_65k_run2.log 2>&1
grep "^# interleaved\|^| " $R/contrastive_loss_h200_gluon_siglip_idle_32k_65k_run2.log | tail -16
pack
echo "elapsed $((SECONDS - T0)) s"
