# 1 x H200 (counts part): the op's Triton strip kernel (a copy, two exponentials) with its items in the op's
# order (0) or column block by column block (1) from 16k to 65k: where each is faster.
source bench/device/env.sh
R=/tmp/ed; mkdir -p $R
DIAG_ORDERS=2 timeout $(left 250) python bench/diag_one_exp.py --sizes 12288,16384,24576,32768,49152,65536 --scales 14.3 \
    --modes two_exp > $R/strips_order_sizes_h200.log 2>&1
cat $R/strips_order_sizes_h200.log | sed 's/max rel.*//'
pack
