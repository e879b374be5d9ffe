# 1 x H200 (counts part), issue 11, after h200_jd (whose Gluon test run its 230 s limit cut at 130 of 134 tests): every
# GPU test of the loss op (tests/ops, -m gpu) with the plain epilogues as committed.
source bench/device/env.sh
R=/tmp/je; mkdir -p $R
timeout 560 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_je.log 2>&1
tail -3 $R/gpu_tests_ops_je.log
pack
echo "elapsed $((SECONDS - T0)) s"
