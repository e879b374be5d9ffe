# (its tmp_*.py is in commit 0c140c7 only: restore it from there to run this again)
# 1 x H200 (counts part), issue 11: the op's Gluon CLIP gradient block with a select- and mask-free path for
# plain tiles (device-only bench/device/tmp_plain_grad.py) against as is: blocks by replay at 32k / 65k, then
# the op queued 20 ms at 16k-65k with it as a variant (same process), the compiled dense anchor.
source bench/device/env.sh
R=/tmp/iv; mkdir -p $R
C1="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block_plain'}"
timeout $(left 300) python bench/device/tmp_plain_grad.py --sizes 16384,32768,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_plain.jsonl \
    --variant "plain:_GLUON=$C1" > $R/contrastive_loss_h200_plain_iv_queued20.log 2>&1
grep "^B=\|^|" $R/contrastive_loss_h200_plain_iv_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
