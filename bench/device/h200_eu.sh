# 1 x H200 (counts part), issue 11: the op's CLIP forward + backward with the 64 x 256 Gluon tiles against the 64 x 128
# ones, call by call in turn behind 20 ms of queued work (bench/diag_tiles_ab.py): h200_et's rows (a block of calls
# each) put the two within 3% either way at 16k-65k while the kernel alone is 3-9% faster.
source bench/device/env.sh
R=/tmp/eu; mkdir -p $R
timeout $(left 400) python bench/diag_tiles_ab.py --sizes 16384,32768,65536 --rounds 30 > $R/tiles_ab_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/tiles_ab_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
