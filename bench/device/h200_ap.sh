# 1 x H200 (counts half): SigLIP's pair log1p as a polynomial (no libdevice log: ~20 instructions
# a pair fewer in the forward's gradient-with-loss epilogue) and the tiles of that kernel without
# spills (TMA 128 x 64 x 8 warps x 2 programs per SM; pointer loads, B < ~2.9k, 128 x 64 x 8 warps
# instead of 128 x 256, which spilled 4 KB a thread: 2x slower than the two-pass path at 1k-2k in
# h200_ao). First the kernels' tiles (TMA at 16k / 65k, pointer at 1k-4k), then the GPU tests of
# the SigLIP paths, then the op against compiled dense SigLIP and its own two-pass path, behind
# 20 ms of queued work and on an idle GPU.
source bench/device/env.sh
R=/tmp/ap; mkdir -p $R
timeout $(left 90) python bench/bench_loss_kernels.py --loss siglip --sizes 16384,65536 --reps 7 --configs 6 \
    --out $R/loss_kernels.jsonl > $R/loss_kernels_siglip.log 2>&1
timeout $(left 150) python bench/bench_loss_kernels.py --loss siglip_pointer --sizes 1024,2048,4096 --reps 7 \
    --out $R/loss_kernels.jsonl > $R/loss_kernels_siglip_pointer.log 2>&1
grep -E "siglip_grad|best" $R/loss_kernels_siglip.log $R/loss_kernels_siglip_pointer.log
pack
timeout $(left 300) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py -k "siglip or paths or graph" \
    > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 450 : 590))) python bench/bench_contrastive_loss.py --big "" --reps 7 \
      --anchors compiled_dense,dense_siglip --siglip-two-pass --queued-ms $q --out $R/contrastive_loss.jsonl \
      > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log | grep "siglip"; done
echo "elapsed $((SECONDS - T0)) s"
