# 1 x H200 (counts part), issue 11 (<= 1.3x the roofline at B >= 32k): the op at 131k and 262k with the code as it
# stands (last measured at 131k in the eleventh session, 190 ms; 262k 897 ms with an earlier version), beside 65k,
# queued 20 ms, CLIP and SigLIP; kernel tables (torch profiler, 3 calls) at 65k and 131k: where the larger B's time goes.
source bench/device/env.sh
R=/tmp/hn; mkdir -p $R
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 65536 --big 131072,262144 --reps 5 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_big.jsonl \
    --profile 65536,131072 --profile-out $R/contrastive_loss_profile_65k_131k_h200.txt \
    > $R/contrastive_loss_h200_big_queued20.log 2>&1
grep "^|\|rror" $R/contrastive_loss_h200_big_queued20.log
grep -A 14 "^## B" $R/contrastive_loss_profile_65k_131k_h200.txt | cut -c1-150
pack
echo "elapsed $((SECONDS - T0)) s"
