# 1 x H200 (counts part): h200_eh again with the collections of each generation during each call of ours, and
# with the collector as it is / the objects so far frozen (gc.freeze) / off.
source bench/device/env.sh
R=/tmp/ei; mkdir -p $R
timeout $(left 300) python bench/diag_interleave.py --b 32768 --rounds 30 --gc auto freeze off > $R/interleave_32k_gc_h200.log 2>&1
cat $R/interleave_32k_gc_h200.log | grep -v Warn | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
