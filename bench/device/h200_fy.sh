# 1 x H200 (counts part), issue 11: at 32k the op stays at 1.35x its roofline (h200_fw); its backward's blocks there are
# 4,096 x 4,096 (the memory bar), whose two gradient GEMMs have 4,096 x 768 outputs (~96-192 tiles for 132 SMs).
# Each GEMM alone, both in turn, both on two streams (bench/device/tmp_grad_gemms.py, device-only, in commit 9869d1e only).
source bench/device/env.sh
R=/tmp/fy; mkdir -p $R
timeout $(left 200) python bench/device/tmp_grad_gemms.py > $R/grad_gemms_streams_h200.log 2>&1
cat $R/grad_gemms_streams_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
