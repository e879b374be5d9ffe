# (Ran on commit d675ac1, whose clip_grad_block_coop and diag_gluon_grad --coop were reverted in the next commit:
# 0.065 against 0.055 ms at 32k, slower at every B; not kept.)
# 1 x H200 (counts part), issue 11: the CLIP gradient block in tiles of 128 x 128 with the two consumers on the two
# 64-row halves at once, sharing each B chunk (gluon_kernels.clip_grad_block_coop: a third less L2 traffic a FLOP
# than the 64 x 128 ping-pong tiles, the same 64-register accumulator) against the op's kernel: P against the
# Triton kernel's and block times (diag_gluon_grad --coop), then the op with it as a variant, queued 20 ms.
source bench/device/env.sh
R=/tmp/il; mkdir -p $R
timeout $(left 200) python bench/diag_gluon_grad.py --cast --sizes 16384,32768,65536,131072 \
    --coop 64,128,64,5 64,128,64,4 > $R/gluon_grad_coop_il_h200.log 2>&1
cat $R/gluon_grad_coop_il_h200.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_coop.jsonl \
    --variant "coop:_GLUON={'on': True, 'tiles': (64, 128, 64, 5), 'launch': 'clip_grad_block_coop'}" \
    > $R/contrastive_loss_h200_coop_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_coop_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
