# 1 x H100 (counts part), issue 11, the twenty-third session: the loss table on an H100 80GB with the code as it stands,
# behind 20 ms of queued work, 1k-65k against the compiled dense losses and 131k alone, one process (as h100_fj).
source bench/device/env.sh
R=/tmp/fu; mkdir -p $R
timeout $(left 585) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big 131072 \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h100_fu.jsonl \
    > $R/contrastive_loss_h100_fu_queued20.log 2>&1
grep "^|\|^# NVIDIA" $R/contrastive_loss_h100_fu_queued20.log | cut -c1-220
tail -3 $R/contrastive_loss_h100_fu_queued20.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
