# 1 x H200 (counts part), issue 11's idle-GPU bar, the final code of 2026-11-24 (sixth session): the op at its
# defaults against the compiled dense losses on an idle GPU, 1k-65k, in blocks of 9 calls per impl (--eager
# beside) and in 60 interleaved rounds whose order rotates (no impl always after the same one).
source bench/device/env.sh
R=/tmp/eo; mkdir -p $R
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 9 --anchors compiled_dense,dense_siglip --eager --interleave 60 --interleave-max 65536 \
    --out $R/contrastive_loss_idle.jsonl > $R/contrastive_loss_h200_final_idle.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_final_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
