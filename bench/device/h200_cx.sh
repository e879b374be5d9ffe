# 1 x H200 (counts part), issue 11: SigLIP's gradient kernels (with and without the pair losses) on 64 x 128
# tiles, 4 warps, two programs an SM (4 or 3 stages) against the op's 128 x 128, 8 warps, one program an SM,
# twice each in one process, behind 20 ms of queued work, 8k-65k.
source bench/device/env.sh
R=/tmp/cx; mkdir -p $R
S="_TMA_SIGLIP_GRAD"; L="_TMA_SIGLIP_GRAD_LOSS"
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 9 \
    --anchors dense_siglip --queued-ms 20 --out $R/contrastive_loss_siglip_tiles.jsonl --variant-siglip \
    --variant "s64k4:$S=(64,128,64,8,4,4,2);$L=(64,128,64,8,4,4,2)" \
    --variant "s64k3:$S=(64,128,64,8,4,3,2);$L=(64,128,64,8,4,3,2)" \
    --variant "op:$S=(128,128,64,8,8,4,1);$L=(128,128,64,8,8,4,1)" \
    --variant "s64k4b:$S=(64,128,64,8,4,4,2);$L=(64,128,64,8,4,4,2)" \
    --variant "s64k3b:$S=(64,128,64,8,4,3,2);$L=(64,128,64,8,4,3,2)" \
    --variant "opb:$S=(128,128,64,8,8,4,1);$L=(128,128,64,8,8,4,1)" \
    > $R/contrastive_loss_h200_siglip_tiles_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_siglip_tiles_queued20.log | grep "siglip\|B |"
pack
echo "elapsed $((SECONDS - T0)) s"
