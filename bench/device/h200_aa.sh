# 1 x H200 (counts half): the fused loss kernels loading by TMA descriptors, persistent
# (ops/contrastive_loss_triton.py): the GPU tests of ops first, then the kernel sweep through the
# op's own kernels, then the op against the compiled dense anchors with the pointer-load kernels
# and the cuBLAS band path in the same process.
source bench/device/env.sh
R=/tmp/aa; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops_tma.log 2>&1
pack
timeout $(left 300) python bench/bench_loss_kernels.py --sizes 16384,65536 --tma --reps 5 \
    --out $R/loss_kernels.jsonl --best $R/tiles.json > $R/loss_kernels.log 2>&1
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --big "" --reps 7 --anchors compiled_dense,dense_siglip \
    --pointer --unfused --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
tail -3 $R/gpu_tests_ops_tma.log; grep "best\|skipped" $R/loss_kernels.log; grep "^|" $R/contrastive_loss.log; echo "elapsed $((SECONDS - T0)) s"
