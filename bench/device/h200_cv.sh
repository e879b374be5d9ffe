# 1 x H200 (counts part), issue 11: the gradient kernel with two programs an SM (4 warps: 128 x 128 in 4 slices,
# 64 x 128 in 2) against the op's tiles (128 x 128, 8 warps, one program an SM, 2 slices), twice each in one
# process, behind 20 ms of queued work, with the compiled dense loss, B = 8k-65k.
source bench/device/env.sh
R=/tmp/cv; mkdir -p $R
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 9 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_two_programs.jsonl \
    --variant "w4s4:_TMA_GRAD=(128,128,64,8,4,3,2,4)" --variant "w4n128:_TMA_GRAD=(64,128,64,8,4,4,2,2)" \
    --variant "op:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    --variant "w4s4b:_TMA_GRAD=(128,128,64,8,4,3,2,4)" --variant "w4n128b:_TMA_GRAD=(64,128,64,8,4,4,2,2)" \
    --variant "opb:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    > $R/contrastive_loss_h200_two_programs_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_two_programs_queued20.log | grep -v siglip
pack
echo "elapsed $((SECONDS - T0)) s"
