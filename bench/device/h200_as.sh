# 1 x H200 (counts half): where the CLIP op's time goes at B = 65,536 (its last row above the compiled
# dense loss, 1.09x) beside the compiled dense loss's own kernels: torch.profiler kernel tables of
# one forward + backward (3 calls) of ours (CLIP, SigLIP) and of compiled dense CLIP / SigLIP.
source bench/device/env.sh
R=/tmp/as; mkdir -p $R
timeout $(left 300) python bench/bench_contrastive_loss.py --sizes 65536 --big "" --reps 5 \
    --anchors compiled_dense,dense_siglip --profile 65536 --profile-out $R/profile_65k.txt \
    --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
grep "^|" $R/contrastive_loss.log; grep -E "^#|^## |Self CUDA|^ *[a-z_].*(us|ms) " $R/profile_65k.txt | cut -c1-40,100-200 | head -90
echo "elapsed $((SECONDS - T0)) s"
