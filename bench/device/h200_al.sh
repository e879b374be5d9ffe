# 1 x H200 (counts half): SigLIP statistics, fused TMA against cuBLAS bands + the pass from 4k to
# 65k (where the SigLIP limit belongs); the GPU tests of ops with the new tiles and limits; the op
# against the compiled dense anchors behind 20 ms of queued work and on an idle GPU.
source bench/device/env.sh
R=/tmp/al; mkdir -p $R
timeout $(left 150) python bench/bench_loss_kernels.py --loss siglip --sizes 4096,8192,16384,32768,65536 --reps 7 \
    --configs 3 --out $R/loss_kernels.jsonl > $R/loss_kernels_siglip.log 2>&1
pack
grep "siglip_stats\|unfused" $R/loss_kernels_siglip.log
timeout $(left 330) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 450 : 580))) python bench/bench_contrastive_loss.py --big "" --reps 7 --anchors compiled_dense,dense_siglip \
      --queued-ms $q --out $R/contrastive_loss.jsonl > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log | grep "ours_bf16 \|ours_siglip"; done; echo "elapsed $((SECONDS - T0)) s"
