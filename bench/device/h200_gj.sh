# 1 x H200 (counts part), issue 11: CLIP at 32k is 1.35-1.39x its roofline with 4,096 x 4,096 backward blocks. Blocks
# of the same P size (2,048 x 8,192: a smaller fp32 row sum; 8,192 x 2,048) and, for reference, 8,192 x 4,096 (over the
# memory bar: _GRAD_FACTOR 2), as variants in one process, queued, CLIP and SigLIP; then the peak of each at 32k.
source bench/device/env.sh
R=/tmp/gj; mkdir -p $R
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --reps 9 --anchors compiled_dense \
    --queued-ms 20 --variant-siglip --variant "b2x8:_GRAD_BLOCKS=((2048, 8192),)" \
    --variant "b8x2:_GRAD_BLOCKS=((8192, 2048),)" --variant "f2:_GRAD_FACTOR=2" \
    --out $R/blocks.jsonl > $R/contrastive_loss_h200_block_shapes_32k_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_block_shapes_32k_queued20.log
pack
for s in "" "_GRAD_BLOCKS=((2048, 8192),)" "_GRAD_BLOCKS=((8192, 2048),)" "_GRAD_FACTOR=2"; do
  echo "## $s" >> $R/loss_memory_block_shapes_32k_h200.log
  timeout $(left 560) python bench/diag_loss_memory.py --b 32768 --set "$s" >> $R/loss_memory_block_shapes_32k_h200.log 2>&1
done
grep -i "##\|peak" $R/loss_memory_block_shapes_32k_h200.log | head -20
pack
echo "elapsed $((SECONDS - T0)) s"
