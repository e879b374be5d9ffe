# 1 x H200 (counts part), issue 11: the Gluon forward sums in launches of at most 2^33 logits and with rotated row
# tiles in launches of at most 32 items a program (h200_hx). The op's GPU tests; then the loss table behind 20 ms
# queued with the compiled dense loss, 1k-65k and 131k / 262k, the op's defaults.
source bench/device/env.sh
R=/tmp/hy; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_hy.log 2>&1
tail -5 $R/gpu_tests_ops_hy.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,4096,16384,32768,65536 --big 131072,262144 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h200_sums_launches.jsonl \
    > $R/contrastive_loss_h200_sums_launches_queued20.log 2>&1
tail -30 $R/contrastive_loss_h200_sums_launches_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
