# 1 x H200 (counts part), issue 11: the plain gradient epilogues. CLIP's plain kernel sums the d-scale terms regrouped
# (no spill under Triton 3.6), SigLIP's blocks without positives in whole tiles take an epilogue without the selects.
# The Gluon GPU tests, then the op queued 20 ms at 16k-65k: CLIP against the previous plain epilogue (tmp_oldplain.py,
# device-only) and against no plain path, SigLIP against no plain path, in one process; the compiled dense anchors.
source bench/device/env.sh
R=/tmp/jb; mkdir -p $R
timeout $(left 260) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    > $R/gpu_tests_gluon_plain2_jb.log 2>&1
tail -3 $R/gpu_tests_gluon_plain2_jb.log
pack
T="(64, 128, 64, 6)"
OLD="{'on': True, 'tiles': $T, 'launch': 'clip_grad_block_old'}"
NOC="{'on': True, 'tiles': $T, 'launch': 'clip_grad_block', 'kw': {'plain': False}}"
NOS="{'on': True, 'tiles': $T, 'launch': 'siglip_grad_block', 'kw': {'plain': False}}"
timeout $(left 580) python bench/device/tmp_oldplain.py --sizes 16384,32768,65536 --big "" \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h200_plain2.jsonl --variant-siglip \
    --variant "oldplain:_GLUON=$OLD" --variant "noplain:_GLUON=$NOC;_GLUON_SIGLIP=$NOS" \
    > $R/contrastive_loss_h200_plain2_jb_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_plain2_jb_queued20.log | cut -c1-200
tail -3 $R/contrastive_loss_h200_plain2_jb_queued20.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
