# 1 x H200 (counts part): the CLIP strip sums by a warp-specialised Gluon kernel with one exponential
# a logit (bench/diag_gluon_sums.py) against the op's Triton strip kernel; then with near-duplicate
# pairs mixed in (column blocks whose shifts spread wide at scale 100).
source bench/device/env.sh
R=/tmp/dv; mkdir -p $R
timeout $(left 200) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 --scales 14.3,100 --chunks 32,64 > $R/gluon_sums_dv_h200.log 2>&1
tail -20 $R/gluon_sums_dv_h200.log
timeout $(left 280) python bench/diag_gluon_sums.py --sizes 65536 --scales 100 --chunks 64 --spread 0.05 > $R/gluon_sums_dv_spread_h200.log 2>&1
tail -4 $R/gluon_sums_dv_spread_h200.log
pack
