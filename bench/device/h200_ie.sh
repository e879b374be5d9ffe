# 1 x H200 (counts part), issue 11: CLIP at 32k, 11.3-11.5 ms (1.30-1.32x the 8.7 ms). Where the call's GPU
# time goes now (the rotated forward sums): the profiler's kernel table at 32k, ours and the compiled dense loss.
source bench/device/env.sh
R=/tmp/ie; mkdir -p $R
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --anchors compiled_dense \
    --queued-ms 20 --profile 32768 --profile-out $R/contrastive_loss_profile_32k_ie_h200.txt \
    --out $R/contrastive_loss_h200_profile_32k.jsonl > $R/contrastive_loss_h200_profile_32k_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_profile_32k_queued20.log
head -40 $R/contrastive_loss_profile_32k_ie_h200.txt | cut -c1-70,150-260
pack
echo "elapsed $((SECONDS - T0)) s"
