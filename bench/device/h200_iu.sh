# (its tmp_*.py is in commit 0c140c7 only: restore it from there to run this again)
# 1 x H200 (counts part), issue 11: h200_it again after taking the index arithmetic of the loads out of the
# consumers' k-loops (the next tile's origin once a tile), with a select-free path for plain tiles as a variant.
source bench/device/env.sh
R=/tmp/iu; mkdir -p $R
timeout $(left 400) python bench/device/tmp_ll_grad.py > $R/gluon_grad_loaderless_iu_h200.log 2>&1
cat $R/gluon_grad_loaderless_iu_h200.log | cut -c1-220
pack
echo "elapsed $((SECONDS - T0)) s"
