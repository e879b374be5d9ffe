# 1 x H200 (counts half): CLIP statistics at 65k, fused TMA kernel against cuBLAS + the two passes
# in one process (whether the TMA limit for the statistics should include 65k).
source bench/device/env.sh
R=/tmp/an; mkdir -p $R
timeout $(left 300) python bench/bench_loss_kernels.py --tma --sizes 65536 --reps 5 \
    --out $R/loss_kernels.jsonl > $R/loss_kernels_65k.log 2>&1
pack
grep "tma\|unfused\|cublas" $R/loss_kernels_65k.log; echo "elapsed $((SECONDS - T0)) s"
