# 1 x H200 (counts part), issue 11: h200_fp's kept-band backward with larger factors (4, 8, 16 forward bands at a
# time) at 32k and 65k, once each, same process, behind 20 ms of queued work.
source bench/device/env.sh
R=/tmp/fq; mkdir -p $R
timeout $(left 120) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --keep-mb 4096 --variant-kept --variant "f4:_KEPT_BANDS_FACTOR=4" --variant "f8:_KEPT_BANDS_FACTOR=8" \
    --variant "f16:_KEPT_BANDS_FACTOR=16" --out $R/kept.jsonl > $R/contrastive_loss_h200_kept_factor8_32k.log 2>&1
timeout $(left 280) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --keep-mb 8192 --variant-kept --variant "f4:_KEPT_BANDS_FACTOR=4" --variant "f8:_KEPT_BANDS_FACTOR=8" \
    --variant "f16:_KEPT_BANDS_FACTOR=16" --out $R/kept.jsonl > $R/contrastive_loss_h200_kept_factor8_65k.log 2>&1
grep -h "^| [0-9]" $R/*.log | grep -v siglip
pack
echo "elapsed $((SECONDS - T0)) s"
