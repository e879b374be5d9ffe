# 1 x H200 (counts part), issue 11: the warp-specialised Gluon kernel for the CLIP forward's column-strip sums
# (gluon_kernels.clip_sums): its sums against the Triton strip kernel's and its GPU time beside cuBLAS's GEMM
# (tile variants), its GPU tests, then the op with it against the Triton strips, queued, 16k-65k.
source bench/device/env.sh
R=/tmp/fs; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 \
    --tiles 64,128,64,8,64 64,128,64,6,64 64,128,64,8,32 64,128,64,8,128 64,128,128,4,64 > $R/gluon_sums_h200.log 2>&1
cat $R/gluon_sums_h200.log
pack
timeout $(left 260) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_sums.log 2>&1
tail -15 $R/gpu_tests_gluon_sums.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --variant "tstrips:_GLUON_SUMS={'on': False, 'tiles': (64, 128, 64, 8, 64)}" \
    --out $R/sums.jsonl > $R/contrastive_loss_h200_gluon_sums_queued20.log 2>&1
grep -h "^| [0-9]\|^| B\|ours_bf16" $R/contrastive_loss_h200_gluon_sums_queued20.log | tail -30
pack
echo "elapsed $((SECONDS - T0)) s"
