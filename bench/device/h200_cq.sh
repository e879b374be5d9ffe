# 1 x H200 (counts part), issue 11: the op with other gradient tiles (SPLIT epilogues, larger tiles) and with
# the unfused gradient block (cuBLAS + the Triton pass; timing only: its d scale is not the op's), against the
# op's tiles and the compiled dense loss, behind 20 ms of queued work, B = 16k-65k.
source bench/device/env.sh
R=/tmp/cq; mkdir -p $R
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 9 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_grad_tiles.jsonl \
    --variant "g128x256s4:_TMA_GRAD=(128,256,64,8,8,4,1,4)" \
    --variant "g128x256s4k3:_TMA_GRAD=(128,256,64,8,8,3,1,4)" \
    --variant "g128x64s2:_TMA_GRAD=(128,64,64,8,4,4,2,2)" \
    --variant "g256x128s2:_TMA_GRAD=(256,128,64,8,8,3,1,2)" \
    --variant "g128x128s2k4:_TMA_GRAD=(128,128,64,8,8,4,1,2)" \
    --variant "gunfused:_TMA_MAX_LOGITS={'stats': 4611686018427387904, 'siglip_stats': 4611686018427387904, 'grad': 0}" \
    > $R/contrastive_loss_h200_grad_tiles_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_grad_tiles_queued20.log
tail -3 $R/contrastive_loss_h200_grad_tiles_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
