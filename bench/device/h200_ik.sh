# 1 x H200 (counts part): the op's GPU tests with the code as it stands (the eighteenth session's kernel changes reverted;
# h200_ih's run of them was cut at 60% by its 300 s limit on a cold Triton cache).
source bench/device/env.sh
R=/tmp/ik; mkdir -p $R
timeout $(left 580) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_ik.log 2>&1
tail -3 $R/gpu_tests_ops_ik.log
pack
echo "elapsed $((SECONDS - T0)) s"
