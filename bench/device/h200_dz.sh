# 1 x H200 (counts part): the Gluon strip sums, every chunk of a column block in turn
# (INFCLIP_SUMS_ORDER 1, a working copy), with longer chunks (128 / 256 / 1024 row blocks of 64).
source bench/device/env.sh
R=/tmp/dz; mkdir -p $R
INFCLIP_SUMS_ORDER=1 timeout $(left 200) python bench/diag_gluon_sums.py --sizes 32768,65536 --scales 14.3 --chunks 64,128,256,1024 > $R/gluon_sums_chunks.log 2>&1
grep -v "^#" $R/gluon_sums_chunks.log | sed 's/max rel.*//'
pack
