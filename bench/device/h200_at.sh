# 1 x H200 (counts half): Triton's warp specialization of the SigLIP gradient-with-loss kernel's
# persistent loop (loads, MMA and epilogue in separate warps: the epilogue is ~2/3 of the kernel at
# 65k, bench/results/contrastive_loss_profile_65k_h200.txt), against the same tiles without it. Ran once
# with a --warp-specialize option of bench_loss_kernels.py, removed with the kernel flag after it (no gain).
source bench/device/env.sh
R=/tmp/at; mkdir -p $R
timeout $(left 200) python bench/bench_loss_kernels.py --loss siglip --sizes 16384,65536 --reps 7 --configs 3 \
    --warp-specialize --out $R/loss_kernels.jsonl > $R/loss_kernels_siglip_ws.log 2>&1
pack
grep -E "siglip_grad_loss|skipped" $R/loss_kernels_siglip_ws.log | cut -c1-200
echo "elapsed $((SECONDS - T0)) s"
