# 1 x H200 (counts half): SigLIP's gradients taken in its forward (one pass: pair losses and
# gradients; the backward only scales). The GPU tests of ops on the SigLIP paths and CUDA graphs,
# then the op against compiled dense SigLIP and against its own two-pass path (statistics in the
# forward, gradients in the backward), behind 20 ms of queued work and on an idle GPU. First the
# gradient kernel's tiles with and without the loss in its epilogue (bench/results/
# kernel_resources_sm90.md: the op's 128 x 128 tiles spill 352 bytes with the loss, 128 x 64 with
# 8 warps none): if another tile wins, set it for the LOSS variant before reading the op's rows.
source bench/device/env.sh
R=/tmp/ao; mkdir -p $R
timeout $(left 90) python bench/bench_loss_kernels.py --loss siglip --sizes 16384,65536 --reps 7 --configs 6 \
    --out $R/loss_kernels.jsonl > $R/loss_kernels_siglip.log 2>&1
grep "siglip_grad" $R/loss_kernels_siglip.log
pack
timeout $(left 220) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py -k "siglip or paths or graph" \
    > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 400 : 585))) python bench/bench_contrastive_loss.py --big "" --reps 7 \
      --anchors compiled_dense,dense_siglip --siglip-two-pass --queued-ms $q --out $R/contrastive_loss.jsonl \
      > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log | grep "siglip"; done
echo "elapsed $((SECONDS - T0)) s"
