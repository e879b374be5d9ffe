# 1 x H200 (counts half): the backward's recompute over blocks of 8,192 x 4,096 (h200_au / h200_av:
# the gradient pass 4-7% faster at 16k-65k than full-width bands, less memory). GPU tests of the op
# (the new "blocks" path among them), then the op against the compiled dense losses (CLIP and SigLIP)
# behind 20 ms of queued work and on an idle GPU.
source bench/device/env.sh
R=/tmp/aw; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
for q in 20 0; do
  timeout $(left $((q == 20 ? 400 : 580))) python bench/bench_contrastive_loss.py --big "" --reps 7 \
      --anchors compiled_dense,dense_siglip --queued-ms $q --out $R/contrastive_loss.jsonl \
      > $R/contrastive_loss_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep "^|" $R/contrastive_loss_q$q.log; done
echo "elapsed $((SECONDS - T0)) s"
