# 1 x H200 (counts part): why the op's idle time at 32k spread when alternating with the dense losses
# (h200_eg): raw times alone / alternating, with the SM clock (bench/diag_interleave.py).
source bench/device/env.sh
R=/tmp/eh; mkdir -p $R
timeout $(left 300) python bench/diag_interleave.py --b 32768 --rounds 30 > $R/interleave_32k_h200.log 2>&1
cat $R/interleave_32k_h200.log | grep -v Warn | tail -20
pack
echo "elapsed $((SECONDS - T0)) s"
