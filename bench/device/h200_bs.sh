# 1 x H200 (counts part): the CLIP statistics by small cuBLAS bands (L2-resident between the GEMM
# and the Triton passes; bf16 / fp32 band buffers, one or two streams) against the fused TMA
# kernel, in one process (bench_loss_kernels.py --bands).
source bench/device/env.sh
R=/tmp/bs; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout $(left 400) python bench/bench_loss_kernels.py --sizes 16384,32768,65536 --bands 128,256,512,1024,2048 \
    --reps 10 --out $R/loss_kernels_bands.jsonl > $R/loss_kernels_bands_h200.log 2>&1
pack
grep -v "^ \|^%\|^}\|^{\|^#loc" $R/loss_kernels_bands_h200.log | grep "B=\|#" | head -80; echo "elapsed $((SECONDS - T0)) s"
