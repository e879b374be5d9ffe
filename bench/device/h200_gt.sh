# (Ran against a prototype not kept: _grad_bands issuing grad_b's GEMM of each block on a side stream after a wait on
# the main one, the main stream waiting on it before the next block, behind the flag _GEMM_STREAMS; see the history.)
# 1 x H200 (counts part), issue 11: the backward's two GEMMs of a block side by side on two streams (_GEMM_STREAMS;
# each of a 4,096 x 4,096 block's fills ~100 of 132 SMs with cuBLAS tiles), against one stream as a variant in one
# process, queued, CLIP and SigLIP, 4k-65k, and the peak at 32k both ways; the op's GPU tests with it; then one rank's
# compute per scheme (the sweeps' rows added straight into their sum, narrow column blocks keeping their own blocks).
source bench/device/env.sh
R=/tmp/gt; mkdir -p $R
timeout $(left 260) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --variant-siglip --variant "one:_GEMM_STREAMS=False" \
    --out $R/streams.jsonl > $R/contrastive_loss_h200_gemm_streams_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gemm_streams_queued20.log
pack
for s in "" "_GEMM_STREAMS=False"; do
  echo "## $s" >> $R/loss_memory_gemm_streams_32k_h200.log
  timeout $(left 330) python bench/diag_loss_memory.py --b 32768 --set "$s" >> $R/loss_memory_gemm_streams_32k_h200.log 2>&1
done
grep -i "##\|peak" $R/loss_memory_gemm_streams_32k_h200.log | head -20
pack
timeout $(left 500) python -m pytest -m gpu -q -p no:warnings tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_gt.log 2>&1
tail -3 $R/gpu_tests_gt.log
pack
timeout $(left 580) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 --loss clip siglip \
    --out $R/rank_compute.jsonl > $R/rank_compute_gt_h200.log 2>&1
grep -v "local_blocks\|weighted" $R/rank_compute_gt_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
