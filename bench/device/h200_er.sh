# 1 x H200 (counts part), issue 11: is the CLIP gradient block bound by the GPU's power? cuBLAS's GEMM, the op's Gluon
# kernel and the 64 x 256 variant (h200_eq: 3-7% faster) each replayed for 4 s while nvidia-smi samples the SM clock
# and power (bench/diag_block_power.py).
source bench/device/env.sh
R=/tmp/er; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.sm --format=csv > $R/block_power_h200.log
timeout $(left 300) python bench/diag_block_power.py --sizes 32768,65536 --seconds 4 >> $R/block_power_h200.log 2>&1
grep -v "leaked\|nanobind\|^ - " $R/block_power_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
