# 1 x H200 (counts part), issue 11: the CLIP op with a logits budget of 2 bytes a pair (logits_budget_mb 8192: the
# forward's bf16 bands kept for the backward, 6 B^2 D) at 16k-65k, with the code as it stands (the last
# measurement of that mode, 46.71 ms at 65k, was of an earlier version), behind 20 ms of queued work, against
# the compiled dense loss and the default op in the same process: is it within 1.3x the 8 B^2 D roofline?
source bench/device/env.sh
R=/tmp/fl; mkdir -p $R
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense --queued-ms 20 --keep-mb 8192 --out $R/contrastive_loss_kept.jsonl \
    > $R/contrastive_loss_h200_kept_queued20.log 2>&1
grep "^|\|^#" $R/contrastive_loss_h200_kept_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
