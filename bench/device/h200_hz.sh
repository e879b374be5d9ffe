# 1 x H200 (counts part), issue 11: past 65k the backward's blocks stay 8,192 x 4,096 (_GRAD_BLOCK) though the budget
# (1.5 max(B D, 2^24) elements) would hold larger ones: 8,192 x 8,192 took the gradient pass 7% faster at 65k in an
# earlier run but over the 65k memory bar. Variants at 131k / 262k (65k as a check that it keeps its blocks): the
# wide blocks first where they fit the budget, 8,192 x 8,192 or 16,384 x 8,192.
source bench/device/env.sh
R=/tmp/hz; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 65536 --big 131072,262144 --anchors compiled_dense \
    --queued-ms 20 --out $R/contrastive_loss_h200_wide_blocks.jsonl \
    --variant "wide8k:_GRAD_BLOCK=(8192,8192);_GRAD_BLOCKS=((8192,4096),(4096,4096))" \
    --variant "wide16k:_GRAD_BLOCK=(16384,8192);_GRAD_BLOCKS=((8192,8192),(8192,4096),(4096,4096))" \
    > $R/contrastive_loss_h200_wide_blocks_queued20.log 2>&1
tail -16 $R/contrastive_loss_h200_wide_blocks_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
