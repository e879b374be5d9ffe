# 1 x H200 (counts half): can a Triton kernel that makes the logit tile with tl.dot reach cuBLAS's
# rate at K = 768? The fused statistics / gradient kernels with TMA tensor descriptors, one
# program per tile or persistent, against the op's pointer kernels and cuBLAS
# (bench/proto_tma_kernels.py).
source bench/device/env.sh
R=/tmp/z; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt 2>&1
timeout $(left 520) python bench/proto_tma_kernels.py --sizes 16384,65536 --reps 5 --out $R/proto_tma.jsonl \
    > $R/proto_tma.log 2>&1
pack
grep -v "^#" $R/proto_tma.log | sort -t' ' -k1,1 | head -150; echo "elapsed $((SECONDS - T0)) s"
