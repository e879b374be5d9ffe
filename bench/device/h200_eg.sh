# 1 x H200 (counts part), issue 11's idle-GPU bar at 32k and 65k, as h200_ef at 1k-16k: the op at its defaults
# against the compiled dense losses on an idle GPU, a block of 7 calls per impl, then 40 interleaved rounds.
source bench/device/env.sh
R=/tmp/eg; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --interleave 40 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_interleaved_idle_32k_65k.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_interleaved_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
