# 1 x H200 (counts part), issue 11: the op with the Gluon gradient blocks launched with programmatic dependent launch
# (the default now) against without (a variant, same process), CLIP and SigLIP queued 20 ms at 16k-65k, then
# 131k / 262k; the compiled dense anchor.
source bench/device/env.sh
R=/tmp/ip; mkdir -p $R
C0="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block', 'kw': {'pdl': False}}"
S0="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block', 'kw': {'pdl': False}}"
timeout $(left 250) python bench/bench_contrastive_loss.py --sizes 16384,24576,32768,49152,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_pdl_default.jsonl \
    --variant "nopdl:_GLUON=$C0;_GLUON_SIGLIP=$S0" --variant-siglip > $R/contrastive_loss_h200_pdl_default_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_pdl_default_queued20.log
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes "" --big 131072,262144 --anchors "" \
    --queued-ms 20 --out $R/contrastive_loss_h200_pdl_big.jsonl \
    --variant "nopdl:_GLUON=$C0;_GLUON_SIGLIP=$S0" --variant-siglip > $R/contrastive_loss_h200_pdl_big_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_pdl_big_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
