# (its tmp_*.py is in commit 0c140c7 only: restore it from there to run this again)
# 1 x H200 (counts part), issue 11: the Gluon CLIP gradient block without a loader warp (8 warps, up to 248
# registers a consumer; tiles of 64 x 128 and 128 x 128 a consumer) against the op's kernel, device-only
# bench/device/tmp_ll_grad.py.
source bench/device/env.sh
R=/tmp/it; mkdir -p $R
timeout $(left 400) python bench/device/tmp_ll_grad.py > $R/gluon_grad_loaderless_it_h200.log 2>&1
cat $R/gluon_grad_loaderless_it_h200.log | cut -c1-220
pack
echo "elapsed $((SECONDS - T0)) s"
