# 1 x H200 (counts part), issue 11: the Gluon kernels' GPU tests after the gradient launchers moved into one helper
# (review mend, same behaviour).
source bench/device/env.sh
R=/tmp/is; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    > $R/gpu_tests_gluon_is.log 2>&1
tail -3 $R/gpu_tests_gluon_is.log
pack
echo "elapsed $((SECONDS - T0)) s"
