# 1 x H200 (counts part), issue 11: whether a cheaper epilogue lets the 128 x 128 tiles pay (h200_ix: MMA alone
# 0.029 against 0.038 ms at 32k, full epilogue 0.049 against 0.050): the wide kernel at DSCALE 1 without the
# positives' selects, with one exponential a logit (row and column factors, no range check), both (timing only;
# device-only bench/device/tmp_wide_grad.py --epi), against it and the op's kernel as they are.
source bench/device/env.sh
R=/tmp/iy; mkdir -p $R
timeout $(left 300) python bench/device/tmp_wide_grad.py --epi > $R/gluon_grad_wide_epi_iy_h200.log 2>&1
cut -c1-200 $R/gluon_grad_wide_epi_iy_h200.log | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
