# 1 x H200 (counts part), issue 11: the CLIP backward's fused gradient kernel with its epilogue in
# column slices (SPLIT) and larger tiles, the op end to end and the block alone, B = 16k-65k; the
# op's kernel table at 65k (where the backward's time goes).
source bench/device/env.sh
R=/tmp/co; mkdir -p $R
timeout $(left 330) python bench/diag_strips.py --sizes 65536,32768,16384 --no-modes --grad \
    128,64,64,8,4,4,2,2 128,64,64,8,4,3,2,2 128,128,64,8,8,3,1,1 128,128,64,8,8,3,1,2 \
    128,128,64,8,8,4,1,2 128,128,64,4,8,3,1,2 128,128,64,8,8,2,2,2 128,256,64,8,8,3,1,2 \
    128,256,64,8,8,3,1,4 128,256,64,8,8,4,1,4 256,128,64,8,8,3,1,2 > $R/grad_split_tiles_h200.log 2>&1
grep "^B=\|^#\|Error" $R/grad_split_tiles_h200.log | cut -c1-150 | head -60
pack
timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 5 --anchors compiled_dense \
    --profile 65536 --profile-out $R/contrastive_loss_profile_65k_h200.txt > $R/contrastive_loss_profile_65k_h200.log 2>&1
head -40 $R/contrastive_loss_profile_65k_h200.txt
pack
echo "elapsed $((SECONDS - T0)) s"
