# 1 x H200 (counts part), issue 11: the Gluon CLIP gradient block with 128 x 128 tiles a consumer in two
# 64-row halves (device-only bench/device/tmp_wide_grad.py) against as is: P and d scale checked, blocks by
# replay at 32k / 65k (DSCALE 2 and 1, alone and with the GEMMs), then the op queued 20 ms at 16k-65k with it as
# a variant (same process), the compiled dense anchor.
source bench/device/env.sh
R=/tmp/iw; mkdir -p $R
C1="{'on': True, 'tiles': (128, 128, 64, 4), 'launch': 'clip_grad_block_wide'}"
timeout $(left 400) python bench/device/tmp_wide_grad.py --sizes 16384,32768,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_wide.jsonl \
    --variant "wide:_GLUON=$C1" > $R/gluon_grad_wide_iw_h200.log 2>&1
grep "^B=\|^|" $R/gluon_grad_wide_iw_h200.log | cut -c1-220
tail -5 $R/gluon_grad_wide_iw_h200.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
