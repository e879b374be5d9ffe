# 1 x H200 (counts part): after the review's edit of gluon_kernels.clip_sums (the launch's stages and meta-parameters
# computed once, not per slab): the Gluon GPU tests, and the sums by replay at 32k / 262k against h200_hx.
source bench/device/env.sh
R=/tmp/if; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    > $R/gpu_tests_gluon_if.log 2>&1
tail -3 $R/gpu_tests_gluon_if.log
timeout $(left 400) python bench/diag_gluon_sums.py --sizes 32768,262144 --reps 3 > $R/gluon_sums_review_if_h200.log 2>&1
grep "TFLOP\|difference" $R/gluon_sums_review_if_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
