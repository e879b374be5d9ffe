# 1 x H200 (counts part), issue 11, after h200_bj: the op with its new defaults (CLIP statistics
# fused at every B with the interior-tile fast path; the backward's blocks of 4,096 x 4,096 below
# ~45k, _GRAD_FACTOR 1.5) from 1k to 65k behind 20 ms of queued work against the compiled dense
# losses, with in the same process the old defaults ("old"), the old block rule alone ("m20"), the
# gradient block by cuBLAS + the Triton pass ("gu"; h200_bj timed the blocks one launch at a time,
# host time included) and 2,048 x 8,192 blocks ("m15b"), for CLIP and SigLIP; the live allocations
# at the peak at 16k / 32k / 65k; the GPU tests of the op.
source bench/device/env.sh
R=/tmp/bk; mkdir -p $R
BIG=4611686018427387904
timeout $(left 270) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl --variant-siglip \
    --variant "old:_TMA_STATS=(128,64,64,8,4,4,2);_TMA_MAX_LOGITS={'stats':1073741824,'siglip_stats':$BIG,'grad':$BIG};_GRAD_FACTOR=2.0;_GRAD_BLOCKS=()" \
    --variant "m20:_GRAD_FACTOR=2.0;_GRAD_BLOCKS=()" \
    --variant "gu:_TMA_MAX_LOGITS={'stats':$BIG,'siglip_stats':$BIG,'grad':0}" \
    --variant "m15b:_GRAD_BLOCKS=((2048,8192),)" \
    > $R/contrastive_loss_h200_ws_queued20.log 2>&1
pack
grep "^|" $R/contrastive_loss_h200_ws_queued20.log
for b in 16384 32768 65536; do
  timeout $(left 310) python bench/diag_loss_memory.py --b $b >> $R/loss_memory_16k_65k_ws_h200.log 2>&1
done
timeout $(left 320) python bench/diag_loss_memory.py --b 32768 --loss siglip >> $R/loss_memory_16k_65k_ws_h200.log 2>&1
pack
grep -E "^B=" $R/loss_memory_16k_65k_ws_h200.log
timeout $(left 470) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops_ws.log 2>&1
tail -3 $R/gpu_tests_ops_ws.log
pack
echo "elapsed $((SECONDS - T0)) s"
