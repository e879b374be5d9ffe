# 1 x H200 (counts part), issue 11, after h200_jb: the SigLIP plain-block NaN test again (its blocks now big enough for
# the Gluon kernel), then the op queued 20 ms at 1k-8k and 131k / 262k with the same variants as h200_jb (CLIP against
# its previous plain epilogue and against no plain path, SigLIP against no plain path), in one process.
source bench/device/env.sh
R=/tmp/jc; mkdir -p $R
timeout 120 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    -k "plain" > $R/gpu_tests_gluon_plain3_jc.log 2>&1
tail -2 $R/gpu_tests_gluon_plain3_jc.log
pack
T="(64, 128, 64, 6)"
OLD="{'on': True, 'tiles': $T, 'launch': 'clip_grad_block_old'}"
NOC="{'on': True, 'tiles': $T, 'launch': 'clip_grad_block', 'kw': {'plain': False}}"
NOS="{'on': True, 'tiles': $T, 'launch': 'siglip_grad_block', 'kw': {'plain': False}}"
timeout $(left 560) python bench/device/tmp_oldplain.py --sizes 1024,2048,4096,8192 --big "131072,262144" \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h200_plain2.jsonl --variant-siglip \
    --variant "oldplain:_GLUON=$OLD" --variant "noplain:_GLUON=$NOC;_GLUON_SIGLIP=$NOS" \
    > $R/contrastive_loss_h200_plain2_jc_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_plain2_jc_queued20.log | cut -c1-200
tail -3 $R/contrastive_loss_h200_plain2_jc_queued20.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
