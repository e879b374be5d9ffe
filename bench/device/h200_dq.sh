# 1 x H200 (counts part), issue 11 (after h200_dp): a warp-specialised Gluon kernel for the CLIP forward's strip sums
# (ops/gluon_kernels.clip_sums_strips: tiles alternate between two consumers taking turns at the tensor cores,
# column terms in registers per item) against the op's Triton strips kernel, whole B x B at 32k / 65k.
# Now interior tiles (inside the bounds, off the positives) skip the masks (h200_dp: 16.8 against 14.0 ms at 65k).
source bench/device/env.sh
R=/tmp/dq; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_grad.py --sizes 32768,65536 --sums 64,128,64,8 64,128,64,6 \
    > $R/gluon_sums_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_sums_h200.log | tail -14
pack
echo "elapsed $((SECONDS - T0)) s"
