# 1 x H200 (counts part), issue 11: the CLIP op's forward and backward apart, strips (chunks
# shortened at small B) against the per-tile forward; the gradient block with and without the
# d-scale sum (bench/diag_strips.py); the strips' GPU tests.
source bench/device/env.sh
R=/tmp/cj; mkdir -p $R
timeout $(left 150) python bench/diag_strips.py --sizes 4096,8192,16384,32768,65536 \
    --strips 128,128,64,8,4,1,16 > $R/strips_fwd_bwd_h200.log 2>&1
cat $R/strips_fwd_bwd_h200.log | grep -v "^$" | head -60
pack
timeout $(left 260) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py -k "strip" > $R/gpu_tests_strips.log 2>&1
tail -3 $R/gpu_tests_strips.log
pack
echo "elapsed $((SECONDS - T0)) s"
