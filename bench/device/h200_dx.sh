# 1 x H200 (counts part): the strip sums' items in another order (an item's neighbours, run at the
# same time by the other programs, share its column block instead of its rows): the Gluon kernel
# (INFCLIP_SUMS_ORDER 0 / 1, a working copy) and the Triton copies of bench/diag_one_exp.py.
source bench/device/env.sh
R=/tmp/dx; mkdir -p $R
for o in 0 1; do
  INFCLIP_SUMS_ORDER=$o timeout $(left 150) python bench/diag_gluon_sums.py --sizes 32768,65536 --scales 14.3 --chunks 32,64 > $R/gluon_sums_order$o.log 2>&1
  echo order $o; grep -v "^#" $R/gluon_sums_order$o.log | tail -6
done
DIAG_ORDERS=2 timeout $(left 280) python bench/diag_one_exp.py --sizes 32768,65536 --scales 14.3 > $R/one_exp_orders_h200.log 2>&1
tail -24 $R/one_exp_orders_h200.log
pack
