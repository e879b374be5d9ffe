# (Ran on commit d1581ec with the WEIGHTED sums variant and diag_gluon_sums --weighted, both reverted in the next commit.)
# 1 x H200 (counts part), issue 11: CLIP's d scale from the forward instead of the backward's gradient blocks? The Gluon
# gradient block with DSCALE 1 (the forward's weighted sums) against 2 (summed in its epilogue) at 32k-131k, and the
# Gluon forward sums with the weighted sums too (a second register tile; 848 bytes of spill stack in a Triton 3.9 build)
# against without, checked against fp32 torch.
source bench/device/env.sh
R=/tmp/ij; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_grad.py --cast --sizes 32768,65536,131072 --dscale 2 1 \
    > $R/gluon_grad_dscale_ij_h200.log 2>&1
cat $R/gluon_grad_dscale_ij_h200.log
pack
timeout $(left 400) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 --weighted > $R/gluon_sums_weighted_ij_h200.log 2>&1
cat $R/gluon_sums_weighted_ij_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
