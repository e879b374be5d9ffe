# 1 x H200 (counts part), issue 11: where the 128 x 128 tiles' time goes against the op's 64 x 128 (h200_iw found
# them within 2%): both kernels with the epilogue cut to P = S' ("store") or to S' row sums without a store
# ("mma"), DSCALE 1, blocks by replay at 32k / 65k (device-only bench/device/tmp_wide_grad.py --cuts).
source bench/device/env.sh
R=/tmp/ix; mkdir -p $R
timeout $(left 300) python bench/device/tmp_wide_grad.py --cuts > $R/gluon_grad_wide_cuts_ix_h200.log 2>&1
cut -c1-200 $R/gluon_grad_wide_cuts_ix_h200.log | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
