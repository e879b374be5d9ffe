# 1 x H200 (counts part), issue 11: the Gluon SigLIP tests (h200_gd's 100 s ran out before them); then where the Gluon
# CLIP gradient block's time over its MMA goes (0.054 against 0.038 ms for the SigLIP block without its epilogue at
# 32k, h200_ga): copies with its store, its vector loads or its arithmetic cut (bench/device/tmp_clip_grad_variants.py, in commit ecd7fb6 only,
# device-only).
source bench/device/env.sh
R=/tmp/ge; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py -k siglip > $R/gpu_tests_gluon_siglip.log 2>&1
tail -3 $R/gpu_tests_gluon_siglip.log
pack
timeout $(left 300) python bench/device/tmp_clip_grad_variants.py > $R/gluon_clip_grad_cuts_h200.log 2>&1
grep -v "^\s*$" $R/gluon_clip_grad_cuts_h200.log | tail -24
pack
echo "elapsed $((SECONDS - T0)) s"
