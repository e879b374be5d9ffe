# 1 x H100 (counts part), issue 11: on an H100 80GB, the Gluon forward sums with the column block of B resident (h200_fw):
# the sums against the Triton strips and cuBLAS, the Gluon tests, then the op queued at 16k-65k against the Triton strips.
source bench/device/env.sh
R=/tmp/fp; mkdir -p $R
timeout $(left 80) python bench/diag_gluon_sums.py --sizes 32768,65536 > $R/gluon_sums_h100.log 2>&1
grep "ms\|differ" $R/gluon_sums_h100.log
pack
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_sums_h100.log 2>&1
tail -3 $R/gpu_tests_gluon_sums_h100.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --variant "tstrips:_GLUON_SUMS={'on': False, 'tiles': (64, 128, 64, 4, 32)}" \
    --out $R/sums.jsonl > $R/contrastive_loss_h100_gluon_sums_queued20.log 2>&1
grep -h "^| \|^# " $R/contrastive_loss_h100_gluon_sums_queued20.log | grep -v siglip | tail -16
pack
echo "elapsed $((SECONDS - T0)) s"
