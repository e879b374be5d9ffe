# 1 x H100 (counts part), issue 11, the twenty-third session: every GPU test of the loss op (tests/ops, -m gpu) on an
# H100 80GB with the code as it stands (the plain epilogues, one _turn_mma); the last H100 run of them was h100_fj (158).
source bench/device/env.sh
R=/tmp/ft; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $R/gpu_h100.txt
timeout 570 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_h100_ft.log 2>&1
tail -3 $R/gpu_tests_ops_h100_ft.log
pack
echo "elapsed $((SECONDS - T0)) s"
