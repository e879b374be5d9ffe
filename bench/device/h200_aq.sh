# 1 x H200 (counts half): the op with the tiles h200_ap picked (SigLIP gradient-with-loss TMA 128 x 128,
# pointer 128 x 128; SigLIP statistics 256 x 128, fused at every size). GPU tests of the SigLIP
# paths and CUDA graphs, then the op against compiled dense (CLIP and SigLIP) behind 20 ms of queued
# work and on an idle GPU, and the SigLIP statistics kernel (no-grad path) at 16k / 65k.
source bench/device/env.sh
R=/tmp/aq; mkdir -p $R
timeout $(left 120) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py -k "siglip or paths or graph" \
    > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 270 : 420))) python bench/bench_contrastive_loss.py --big "" --reps 7 \
      --anchors compiled_dense,dense_siglip --queued-ms $q --out $R/contrastive_loss.jsonl \
      > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log; done
echo "elapsed $((SECONDS - T0)) s"
