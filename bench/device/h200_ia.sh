# 1 x H200 (counts part), issue 11: the backward's wider blocks where grad_b's end cast covers them (_GRAD_BLOCKS_WIDE:
# 8,192 x 8,192 at 131k, 16,384 x 8,192 at 262k; h200_hz: 188 / 763 against 192 / 799 ms as variants). The op's GPU
# tests; then CLIP and SigLIP at 65k-262k queued 20 ms, the default against the blocks as before (a variant).
source bench/device/env.sh
R=/tmp/ia; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_ia.log 2>&1
tail -3 $R/gpu_tests_ops_ia.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 65536 --big 131072,262144 --anchors compiled_dense \
    --queued-ms 20 --out $R/contrastive_loss_h200_wide_default.jsonl --variant "narrow:_GRAD_BLOCKS_WIDE=()" \
    --variant-siglip > $R/contrastive_loss_h200_wide_default_queued20.log 2>&1
tail -20 $R/contrastive_loss_h200_wide_default_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
