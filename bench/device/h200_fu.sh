# 1 x H200 (counts part), issue 11: h200_fs again with the Gluon sums kernel keeping its column block of B in shared memory
# (A streams alone: a third of the loads a tile; the streamed-B kernel of h200_fs ran 0.8x the Triton strips; h200_ft: its
# MMA alone no faster): the sums, GPU time by tile variant, its GPU tests, the op against the Triton strips, queued.
source bench/device/env.sh
R=/tmp/fu; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 \
    --tiles 64,128,64,4,64 64,128,32,8,64 64,128,64,4,32 64,128,64,4,128 64,128,64,3,64 > $R/gluon_sums_resident_h200.log 2>&1
cat $R/gluon_sums_resident_h200.log
pack
timeout $(left 260) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_sums_resident.log 2>&1
tail -15 $R/gpu_tests_gluon_sums_resident.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --variant "tstrips:_GLUON_SUMS={'on': False, 'tiles': (64, 128, 64, 4, 64)}" \
    --out $R/sums.jsonl > $R/contrastive_loss_h200_gluon_sums_resident_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gluon_sums_resident_queued20.log | tail -20
pack
echo "elapsed $((SECONDS - T0)) s"
