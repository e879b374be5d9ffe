# 1 x H200 (counts part), issue 11: with the logits kept as the forward's bf16 bands (h200_fo: 1.34x the roofline
# at 32k, 1.24-1.25x at 65k), the backward reads them in bands of the forward's height (1,536 rows here), and
# each band's P^T @ A adds into the fp32 [B, D] sum of dT: re-read and re-written ~21 / ~43 times a call. Here
# the backward takes 2 and 4 forward bands at a time (_KEPT_BANDS_FACTOR, variants f2 / f4 with the same budget),
# against factor 1 and the compiled dense loss in the same process, behind 20 ms of queued work.
source bench/device/env.sh
R=/tmp/fp; mkdir -p $R
for run in 1 2; do
  timeout $(left 200) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --reps 7 --anchors compiled_dense \
      --queued-ms 20 --keep-mb 4096 --variant-kept --variant "f2:_KEPT_BANDS_FACTOR=2" --variant "f4:_KEPT_BANDS_FACTOR=4" \
      --out $R/kept.jsonl > $R/contrastive_loss_h200_kept_factor_32k_run$run.log 2>&1
  timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 7 --anchors compiled_dense \
      --queued-ms 20 --keep-mb 8192 --variant-kept --variant "f2:_KEPT_BANDS_FACTOR=2" --variant "f4:_KEPT_BANDS_FACTOR=4" \
      --out $R/kept.jsonl > $R/contrastive_loss_h200_kept_factor_65k_run$run.log 2>&1
done
grep -h "^| [0-9]" $R/*.log | grep -v siglip
pack
echo "elapsed $((SECONDS - T0)) s"
