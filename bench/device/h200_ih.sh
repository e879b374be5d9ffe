# (Ran on commit fc6e6e5, whose _SIDE_GEMM_MAX was reverted in 3179761: 0.7% at 32k, not kept.)
# 1 x H200 (counts part), issue 11: a block's grad_b GEMM on a side stream beside its grad_a GEMM where both write
# <= 4,096 rows (_SIDE_GEMM_MAX; h200_ig: block + GEMMs 0.1286 against 0.1322 ms at 32k). The op's GPU tests; then
# CLIP and SigLIP at 16k-65k queued 20 ms, the default against one stream (a variant), the compiled dense anchors.
source bench/device/env.sh
R=/tmp/ih; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops > $R/gpu_tests_ops_ih.log 2>&1
tail -3 $R/gpu_tests_ops_ih.log
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 16384,24576,32768,49152,65536 --big "" \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h200_side_gemm.jsonl \
    --variant "one_stream:_SIDE_GEMM_MAX=0" --variant-siglip > $R/contrastive_loss_h200_side_gemm_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_side_gemm_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
