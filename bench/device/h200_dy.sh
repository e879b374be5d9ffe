# 1 x H200 (counts part): the Gluon strip sums with items in groups of G column blocks, chunk after
# chunk (INFCLIP_SUMS_ORDER = G; 1: every chunk of a column block in turn; a working copy).
source bench/device/env.sh
R=/tmp/dy; mkdir -p $R
for o in 1 4 8 16 33 66; do
  INFCLIP_SUMS_ORDER=$o timeout $(left 270) python bench/diag_gluon_sums.py --sizes 32768,65536 --scales 14.3 --chunks 16,64 > $R/gluon_sums_group$o.log 2>&1
  echo group $o; grep -v "^#" $R/gluon_sums_group$o.log | grep -v triton | tail -4
done
pack
