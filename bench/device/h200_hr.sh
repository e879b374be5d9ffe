# 1 x H200 (counts part), issue 11: the loss table's queued calls start behind a sleep kernel, i.e. at an idle GPU's
# clock, while in training they follow the towers' matmuls at the 700 W cap (h200_hp: cuBLAS ~720 TFLOP/s in single
# calls after idle, ~600 through a burst). The op and the compiled dense losses at 4k-65k behind 20 ms of bf16 GEMMs
# (--queued-work gemm), then behind the sleep as before, each in its own process.
source bench/device/env.sh
R=/tmp/hr; mkdir -p $R
for work in gemm sleep; do
  timeout $(left $([ $work = gemm ] && echo 260 || echo 500)) python bench/bench_contrastive_loss.py \
      --sizes 4096,16384,32768,65536 --big "" --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 \
      --queued-work $work --out $R/contrastive_loss_$work.jsonl > $R/contrastive_loss_h200_queued20_$work.log 2>&1
  echo "== behind $work"; grep "^|\|rror" $R/contrastive_loss_h200_queued20_$work.log
  pack
done
echo "elapsed $((SECONDS - T0)) s"
