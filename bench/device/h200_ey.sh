# 1 x H200 (counts part), issue 11 (idle GPU at 32k-65k: at parity over the day's five runs, 0.88-1.16x; after the
# block memo, h200_ep, all four at or under 1): the idle bench at 32k / 65k twice more, interleaved 60 rounds, with
# the code as it stands (64 x 128 Gluon tiles); the bench's header now also gives the GEMM rate sustained at the cap.
source bench/device/env.sh
R=/tmp/ey; mkdir -p $R
for run in 1 2; do
  timeout $(left $((run * 280))) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
      --anchors compiled_dense,dense_siglip --interleave 60 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
      > $R/contrastive_loss_h200_idle_32k_65k_run$run.log 2>&1
  grep "^# NVIDIA\|^# interleaved" $R/contrastive_loss_h200_idle_32k_65k_run$run.log
  pack
done
echo "elapsed $((SECONDS - T0)) s"
