# 1 x H200 (counts part), issue 11: CLIP at 65k is 1.07-1.09x the compiled dense loss and 1.56x
# the roofline; its fused GEMM + epilogue kernels run at ~35-50% of the tensor-core rate. The
# kernels' variants (bench_loss_kernels.py --variants: warp specialisation of the persistent loop,
# the interior-tile fast path without masks, one exponential for the gradient's column term,
# tiles with 8 warps / 128 x 128 / 128 x 256, 1-3 programs per SM) against cuBLAS's GEMM of the
# same logits, one process without and one with warp specialisation (a compiler abort in the
# second cannot take the first's numbers); then the op end to end behind 20 ms of queued work with
# the fastest variants and with smaller backward blocks (_GRAD_FACTOR / _GRAD_BLOCKS: the peak at
# 16k / 32k), and the live allocations at the peak for those.
source bench/device/env.sh
R=/tmp/bj; mkdir -p $R
timeout $(left 200) python bench/bench_loss_kernels.py --variants --ws off --sizes 16384,32768,65536 --reps 7 \
    --out $R/loss_kernels.jsonl --best $R/best_nows.json > $R/loss_kernels_ws_variants.log 2>&1
pack
timeout $(left 300) python bench/bench_loss_kernels.py --variants --ws on --sizes 16384,65536 --reps 7 \
    --out $R/loss_kernels.jsonl --best $R/best_ws.json > $R/loss_kernels_ws_on.log 2>&1
pack
grep -v "^# check" $R/loss_kernels_ws_variants.log | cut -c1-120; grep -v "^# check" $R/loss_kernels_ws_on.log | cut -c1-120
grep -h "^# check" $R/loss_kernels_ws_*.log | awk '{ if ($NF + 0 > 0.02) print "BAD", $0 }' | head
cat $R/best_*.json
V=""  # (a variant's file is there only if its sweep finished)
[ -s $R/best_nows.json ] && V="--variant fast:_TMA_STATS=@$R/best_nows.json:tma_stats;_TMA_GRAD=@$R/best_nows.json:tma_grad \
  --variant fast_m15:_GRAD_FACTOR=1.5;_GRAD_BLOCKS=((4096,4096),);_TMA_STATS=@$R/best_nows.json:tma_stats;_TMA_GRAD=@$R/best_nows.json:tma_grad"
[ -s $R/best_nows.json ] && V="$V --variant fast_all:_TMA_MAX_LOGITS={'stats':4611686018427387904,'siglip_stats':4611686018427387904,'grad':4611686018427387904};_TMA_STATS=@$R/best_nows.json:tma_stats;_TMA_GRAD=@$R/best_nows.json:tma_grad"
[ -s $R/best_ws.json ] && V="$V --variant ws:_TMA_STATS=@$R/best_ws.json:tma_stats;_TMA_GRAD=@$R/best_ws.json:tma_grad"
timeout $(left 440) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss.jsonl $V \
    --variant "m15:_GRAD_FACTOR=1.5;_GRAD_BLOCKS=((4096,4096),)" --variant "m10:_GRAD_FACTOR=1.0;_GRAD_BLOCKS=((4096,4096),)" \
    --variant "b1536:_GRAD_FACTOR=1.5" \
    > $R/contrastive_loss_h200_ws_q20.log 2>&1
pack
grep "^|" $R/contrastive_loss_h200_ws_q20.log
for b in 16384 32768; do
  timeout $(left 470) python bench/diag_loss_memory.py --b $b --set "_GRAD_FACTOR=1.5;_GRAD_BLOCKS=((4096,4096),)" >> $R/loss_memory_16k_32k_ws_h200.log 2>&1
done
pack
grep -E "^B=|settings" $R/loss_memory_16k_32k_ws_h200.log
echo "elapsed $((SECONDS - T0)) s"
