# 1 x H200 (counts part), issue 11: where CLIP at 32k stands against 1.3x the roofline with the code as it stands,
# read over five processes (each measures its own roofline rate at its start; the reading moved 1.29-1.39x between
# single runs), then 65k-262k once. Queued 20 ms, as the README's table.
source bench/device/env.sh
R=/tmp/im; mkdir -p $R
for i in 1 2 3 4 5; do
  timeout $(left 330) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --anchors compiled_dense \
      --queued-ms 20 --out $R/contrastive_loss_h200_32k_x5.jsonl > $R/contrastive_loss_h200_32k_run${i}_queued20.log 2>&1
  grep -E "TFLOP|^\| 32,768" $R/contrastive_loss_h200_32k_run${i}_queued20.log
done
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 65536 --big 131072,262144 --anchors compiled_dense \
    --queued-ms 20 --out $R/contrastive_loss_h200_big_im.jsonl > $R/contrastive_loss_h200_big_im_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_big_im_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
