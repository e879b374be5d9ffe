# 1 x H200 (counts part), issue 11 (CLIP at 32k, 1.35-1.39x the roofline): the gradient kernels' ring with GROUP
# chunks of K behind one barrier pair (h200_gm's profile: ~21% of the k-loop's samples stalled at the warpgroup
# barrier that precedes each slot's release, one a chunk). The blocks at 16k / 32k / 65k, groups of 1 / 2 / 3
# (1 twice), CLIP and SigLIP; then the op behind 20 ms of queued work with groups of 2 as a variant in the same process.
# Ran at commit 701d02e (ops/gluon_kernels.py with GROUP; reverted in the commit after it: no group was faster).
source bench/device/env.sh
R=/tmp/hl; mkdir -p $R
timeout $(left 200) python bench/diag_gluon_grad.py --sizes 16384,32768,65536 --reps 15 --siglip \
    --tiles 64,128,64,6,1 64,128,64,6,2 64,128,64,6,3 64,128,64,6,1 > $R/gluon_grad_groups_hl_h200.log 2>&1
cat $R/gluon_grad_groups_hl_h200.log
pack
G2='"on":True,"tiles":(64,128,64,6,2)'
timeout $(left 480) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    --variant "g2:_GLUON={$G2,\"launch\":\"clip_grad_block\"};_GLUON_SIGLIP={$G2,\"launch\":\"siglip_grad_block\"}" \
    --variant-siglip > $R/contrastive_loss_h200_groups_queued20.log 2>&1
grep "^|\|rror" $R/contrastive_loss_h200_groups_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
