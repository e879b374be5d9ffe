# 1 x H100 (counts part), issue 11: on an H100 80GB, the op's GPU tests with the kept-band backward taking 4 forward bands at a
# time (_KEPT_BANDS_FACTOR = 4, h200_fp / h200_fq), and the loss table's 32k / 65k kept rows with it as the default, factor 1 as a variant in the same process.
source bench/device/env.sh
R=/tmp/fo; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_kept_factor4_h100.log 2>&1
tail -3 $R/gpu_tests_ops_kept_factor4_h100.log
pack
timeout $(left 360) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --keep-mb 4096 --variant-kept --variant "f1:_KEPT_BANDS_FACTOR=1" --out $R/kept.jsonl > $R/contrastive_loss_h100_kept4096_32k_factor4.log 2>&1
timeout $(left 440) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --keep-mb 8192 --variant-kept --variant "f1:_KEPT_BANDS_FACTOR=1" --out $R/kept.jsonl > $R/contrastive_loss_h100_kept8192_65k_factor4.log 2>&1
grep -h "^| [0-9]" $R/contrastive_loss_h100_kept*_factor4.log | grep -v siglip
pack
echo "elapsed $((SECONDS - T0)) s"
