# 1 x H200 (counts part), issue 11: the Gluon sums kernel ran slower than the Triton strips (h200_fs); where its
# time goes: variants with parts of the epilogue cut (bench/device/tmp_sums_variants.py, a device-only script
# in commit 9869d1e only), beside cuBLAS's GEMM and the Gluon gradient block.
source bench/device/env.sh
R=/tmp/ft; mkdir -p $R
timeout $(left 280) python bench/device/tmp_sums_variants.py > $R/gluon_sums_variants_h200.log 2>&1
cat $R/gluon_sums_variants_h200.log | tail -30
pack
echo "elapsed $((SECONDS - T0)) s"
