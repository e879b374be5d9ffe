# 1 x H200 (counts half): the loss op with the matrix kept from forward to backward as the
# forward's bf16 bands (logits_budget_mb large enough: 6 B^2 D GEMM FLOPs instead of 8): the GPU
# tests of the triton paths first, then CLIP and SigLIP against the compiled dense anchors.
source bench/device/env.sh
R=/tmp/y; mkdir -p $R
timeout $(left 170) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py -k "paths or graph" \
    > $R/gpu_tests_ops_kept_bands.log 2>&1
pack
timeout $(left 540) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" --reps 5 \
    --anchors compiled_dense,dense_siglip --keep-mb 8192 --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
tail -2 $R/gpu_tests_ops_kept_bands.log; grep "^|" $R/contrastive_loss.log; echo "elapsed $((SECONDS - T0)) s"
