# 1 x H200 (counts half): tile sweeps of the SigLIP TMA kernels (statistics, gradient block) at
# 16k and 65k, and of the CLIP kernels at 32k (fused TMA statistics against cuBLAS + passes).
source bench/device/env.sh
R=/tmp/ak; mkdir -p $R
timeout $(left 280) python bench/bench_loss_kernels.py --loss siglip --sizes 16384,65536 --reps 7 \
    --out $R/loss_kernels.jsonl --best $R/tiles_siglip.json > $R/loss_kernels_siglip.log 2>&1
pack
timeout $(left 560) python bench/bench_loss_kernels.py --tma --sizes 32768 --reps 7 \
    --out $R/loss_kernels.jsonl --best $R/tiles_32k.json > $R/loss_kernels_32k.log 2>&1
pack
grep -v "^#.*skipped" $R/loss_kernels_siglip.log; grep "tma\|unfused\|best\|cublas" $R/loss_kernels_32k.log; echo "elapsed $((SECONDS - T0)) s"
