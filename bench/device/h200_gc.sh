# 1 x H200 (counts part), issue 11: h200_gb found the Gluon SigLIP block fast with its pair losses after G's store (0.068
# against 0.082 ms for the Triton kernel at 32k) and slow with an atomic before the store's fence (0.114). The losses'
# sum before the store with every atomic after it (as is), against the losses after the store, recomputed from the
# accumulator after it, with G's sums before or after it (bench/device/tmp_siglip_variants.py, device-only, in commit ecd7fb6 only).
source bench/device/env.sh
R=/tmp/gc; mkdir -p $R
timeout $(left 300) python bench/device/tmp_siglip_variants.py > $R/gluon_siglip_orders_h200.log 2>&1
cat $R/gluon_siglip_orders_h200.log | grep -v "^\s*$" | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
