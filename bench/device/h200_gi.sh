# 1 x H200 (counts part), issue 11: the Gluon GPU tests with a new one: each Gluon kernel whose first launch fails falls
# back to the Triton kernel with one warning, in the same call, the others staying on.
source bench/device/env.sh
R=/tmp/gi; mkdir -p $R
timeout $(left 400) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_gi.log 2>&1
tail -15 $R/gpu_tests_gluon_gi.log
pack
echo "elapsed $((SECONDS - T0)) s"
