# 1 x H200 (counts part), issue 11: h200_fz found the Gluon SigLIP block slower than the Triton kernel in the op (47.8
# against 41.2 ms at 65k) and its G's sign flipped (fixed). Its GPU tests again; the block alone against the Triton
# kernel and cuBLAS, and with its atomics and / or its store cut (bench/device/tmp_siglip_variants.py, device-only, in commit ecd7fb6 only: its
# CUTS then, BODIES since h200_gb).
source bench/device/env.sh
R=/tmp/ga; mkdir -p $R
timeout $(left 120) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py -k siglip > $R/gpu_tests_gluon_siglip.log 2>&1
tail -5 $R/gpu_tests_gluon_siglip.log
pack
timeout $(left 400) python bench/device/tmp_siglip_variants.py > $R/gluon_siglip_variants_h200.log 2>&1
cat $R/gluon_siglip_variants_h200.log | grep -v "^\s*$" | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
