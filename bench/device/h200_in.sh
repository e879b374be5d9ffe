# (Ran on commit 842300d with PDL modes 0 / 1 / 2 and bench/device/tmp_pdl_check.py, deleted in the next commit;
# the kept option is mode 1 as gluon_kernels.GRAD_PDL, on by default.)
# 1 x H200 (counts part), issue 11: the Gluon gradient blocks launched with programmatic dependent launch (PDL):
# mode 1, every partition waits (griddepcontrol.wait) for the previous kernel first; mode 2, the loader loads A and B
# before that wait (the block's launch and first loads beside the previous GEMM's end). Results against mode 0 (the
# op's) bit for bit, then the op queued 20 ms with modes 1 and 2 as variants beside the default, CLIP and SigLIP.
source bench/device/env.sh
R=/tmp/in; mkdir -p $R
timeout $(left 120) python bench/device/tmp_pdl_check.py 32768 > $R/pdl_check_in_h200.log 2>&1
timeout $(left 160) python bench/device/tmp_pdl_check.py 4096 >> $R/pdl_check_in_h200.log 2>&1
cat $R/pdl_check_in_h200.log
pack
P1="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block', 'kw': {'pdl': 1}}"
P2="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block', 'kw': {'pdl': 2}}"
S1="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block', 'kw': {'pdl': 1}}"
S2="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block', 'kw': {'pdl': 2}}"
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_pdl.jsonl \
    --variant "pdl1:_GLUON=$P1;_GLUON_SIGLIP=$S1" --variant "pdl2:_GLUON=$P2;_GLUON_SIGLIP=$S2" --variant-siglip \
    > $R/contrastive_loss_h200_pdl_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_pdl_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
