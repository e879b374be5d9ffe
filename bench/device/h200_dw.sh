# 1 x H200 (counts part): where the Gluon strip sums' time goes (a working copy of ops/gluon_kernels.py
# with INFCLIP_SUMS_MODE: 0 as committed, 1 row sums kept in registers instead of atomics, 2 the MMA alone).
source bench/device/env.sh
R=/tmp/dw; mkdir -p $R
for m in 0 1 2; do
  INFCLIP_SUMS_MODE=$m timeout $(left 250) python bench/diag_gluon_sums.py --sizes 32768,65536 --scales 14.3 --chunks 64 > $R/gluon_sums_mode$m.log 2>&1
  echo mode $m; grep -v "^#" $R/gluon_sums_mode$m.log | tail -4
done
pack
