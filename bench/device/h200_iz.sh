# 1 x H200 (counts part), issue 11: the wide (128 x 128 a consumer) CLIP gradient kernel with the select- and
# mask-free epilogue for blocks holding no positive (h200_iy: 0.043 against 0.050 ms at DSCALE 1 without selects),
# the op's kernel for the others (device-only bench/device/tmp_wide_grad.py --plain): a block without positives
# at 32k / 65k (P, d scale, time alone and with its GEMMs), then the op queued 20 ms at 16k-262k with it as a
# variant (same process), the compiled dense anchor up to 65k.
source bench/device/env.sh
R=/tmp/iz; mkdir -p $R
C1="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block_wideplain'}"
timeout $(left 500) python bench/device/tmp_wide_grad.py --plain --sizes 16384,32768,65536 --big "131072,262144" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_wideplain.jsonl \
    --variant "wp:_GLUON=$C1" > $R/gluon_grad_wideplain_iz_h200.log 2>&1
grep "^B=\|^|" $R/gluon_grad_wideplain_iz_h200.log | cut -c1-220
tail -3 $R/gluon_grad_wideplain_iz_h200.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
