# 1 x H200 (counts part), issue 11: the Gluon forward sums ran 609 / 603 / 460 TFLOP/s at 65k / 131k / 262k by replay
# (h200_ho; the Triton strips 484-491 at every size). A power or thermal cap, or the kernel at that size? cuBLAS's GEMM
# of a 65,536-row band and the sums, each in a 3 s burst (rate over five stretches) and spaced after 1 s idle, at 65k
# and 262k, nvidia-smi's SM clock / power / temperature meanwhile (bench/diag_sustained.py).
source bench/device/env.sh
R=/tmp/hp; mkdir -p $R
timeout $(left 300) python bench/diag_sustained.py --what gemm,sums --b 65536,262144,65536 --seconds 3 \
    > $R/sustained_gemm_sums_hp_h200.log 2>&1
cat $R/sustained_gemm_sums_hp_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
