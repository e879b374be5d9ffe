# 1 x H200 (counts part), issue 10: where ZeRO-3's extra Python calls per step come from against ZeRO-2
# (ViT-B/32, micro-batch 256, the README's ZeRO-3 settings; bench/diag_zero3_calls.py).
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/ek; mkdir -p $R
timeout $(left 400) python bench/diag_zero3_calls.py --steps 5 > $R/zero3_calls_h200.log 2>&1
grep "Python calls a step\|Error\|error" $R/zero3_calls_h200.log | head
pack
echo "elapsed $((SECONDS - T0)) s"
