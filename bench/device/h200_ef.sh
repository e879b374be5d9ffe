# 1 x H200 (counts part), issue 11's idle-GPU bar at 1k-16k: the op at its defaults (CUDA-graph replay)
# against the compiled dense losses on an idle GPU, as before (a block of 9 calls per impl, --eager beside),
# then interleaved: 150 rounds each calling ours_bf16, ours_siglip_bf16, compiled_dense and dense_siglip
# in turn, medians and per-round paired ratios (host drift reaches every impl alike).
source bench/device/env.sh
R=/tmp/ef; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --interleave 150 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_interleaved_idle.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_interleaved_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
