# 1 x H200 (counts part), issue 11: CLIP at 32k over five processes again (as h200_im), the Gluon gradient blocks now
# launched with programmatic dependent launch (GRAD_PDL), queued 20 ms.
source bench/device/env.sh
R=/tmp/iq; mkdir -p $R
for i in 1 2 3 4 5; do
  timeout $(left 330) python bench/bench_contrastive_loss.py --sizes 32768 --big "" --anchors compiled_dense \
      --queued-ms 20 --out $R/contrastive_loss_h200_32k_x5_iq.jsonl > $R/contrastive_loss_h200_32k_run${i}_iq_queued20.log 2>&1
  grep -E "TFLOP|^\| 32,768" $R/contrastive_loss_h200_32k_run${i}_iq_queued20.log
done
pack
echo "elapsed $((SECONDS - T0)) s"
