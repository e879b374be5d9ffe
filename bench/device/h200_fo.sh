# 1 x H200 (counts part), issue 11: h200_fl's kept-logits rows again (the same warm machine): at 32k a budget of
# 4,096 MiB (the bf16 bands, 2 GiB; h200_fl's 8,192 kept the fp32 matrix there, 6 GiB), at 65k 8,192 MiB (bf16
# bands, 8 GiB), twice each, behind 20 ms of queued work, against the compiled dense loss in the same process.
source bench/device/env.sh
R=/tmp/fo; mkdir -p $R
for run in 1 2; do
  timeout $(left 150) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --reps 7 --anchors compiled_dense \
      --queued-ms 20 --keep-mb 4096 --out $R/kept.jsonl > $R/contrastive_loss_h200_kept4096_32k_run$run.log 2>&1
  timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 7 --anchors compiled_dense \
      --queued-ms 20 --keep-mb 8192 --out $R/kept.jsonl > $R/contrastive_loss_h200_kept8192_65k_run$run.log 2>&1
done
grep -h "^| [0-9]" $R/*.log
pack
echo "elapsed $((SECONDS - T0)) s"
