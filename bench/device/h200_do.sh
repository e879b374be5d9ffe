# 1 x H200 (counts part), issue 11: the Gluon gradient block storing P from the registers by masked pointers
# (PTR_STORE) against the copy engine through shared memory (h200_dj: the store was the largest part of the
# epilogue left over the MMA), 32k / 65k blocks.
# (PTR_STORE measured slower, 0.120 against 0.106 ms at 65k, and removed after this call: the ops kernel
# of dcdd71f plus a PTR_STORE constexpr ran here; log bench/results/gluon_grad_do_h200.log)
source bench/device/env.sh
R=/tmp/do; mkdir -p $R
timeout $(left 100) python bench/diag_gluon_grad.py --sizes 32768,65536 --tiles 64,128,64,6 64,128,64,6,1 64,128,64,4,1 \
    > $R/gluon_grad_ptr_store_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_ptr_store_h200.log | tail -14
pack
echo "elapsed $((SECONDS - T0)) s"
