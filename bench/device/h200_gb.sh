# 1 x H200 (counts part), issue 11: h200_ga found the Gluon SigLIP block's pair losses costing 0.05 ms of 0.11 at 32k
# (without them 0.062, the Triton kernel with them 0.081). Variants of the losses' epilogue (bench/device/
# tmp_siglip_variants.py, device-only, in commit ecd7fb6 only): log1p by the log of 1 + e with its correction, no polynomial, no NaN term, the
# losses after G's store.
source bench/device/env.sh
R=/tmp/gb; mkdir -p $R
timeout $(left 300) python bench/device/tmp_siglip_variants.py > $R/gluon_siglip_loss_variants_h200.log 2>&1
cat $R/gluon_siglip_loss_variants_h200.log | grep -v "^\s*$" | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
