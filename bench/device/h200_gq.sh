# 1 x H200 (counts part), review: the ring's barriers allocated and initialised by one helper (_ring_barriers) for the
# gradient kernels and the forward sums. The Gluon GPU tests, and the sums' time at 32k / 65k (h200_gn: 2.96 / 10.94 ms).
source bench/device/env.sh
R=/tmp/gq; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_gq.log 2>&1
tail -3 $R/gpu_tests_gluon_gq.log
pack
timeout $(left 420) python bench/diag_gluon_sums.py --sizes 32768,65536 > $R/gluon_sums_gq_h200.log 2>&1
cat $R/gluon_sums_gq_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
