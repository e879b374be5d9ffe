# 1 x H200 (counts part), issue 11: the resident-B Gluon sums kernel with its ring sized to what shared memory leaves
# (h200_fu: 4 stages of 64 needed 233,584 bytes under Triton 3.6, over the 232,448 limit, so the op fell back to the
# Triton strips there; 3 stages ran 11.70 against 13.46 ms at 65k). Tile variants (BLOCK_K 32 rings of 6-8 stages,
# chunks), its GPU tests, the op against the Triton strips queued at 8k-65k, and the strips from 8k (_STRIPS_MIN_LOGITS).
source bench/device/env.sh
R=/tmp/fv; mkdir -p $R
timeout $(left 150) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 \
    --tiles 64,128,64,4,64 64,128,32,8,64 64,128,32,6,64 64,128,64,4,32 64,128,64,4,128 > $R/gluon_sums_stages_h200.log 2>&1
cat $R/gluon_sums_stages_h200.log
pack
timeout $(left 270) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_sums_stages.log 2>&1
tail -4 $R/gpu_tests_gluon_sums_stages.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --variant "tstrips:_GLUON_SUMS={'on': False, 'tiles': (64, 128, 64, 4, 64)}" \
    --variant "strips_from_8k:_STRIPS_MIN_LOGITS=67108864" \
    --out $R/sums.jsonl > $R/contrastive_loss_h200_gluon_sums_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gluon_sums_queued20.log | grep -v siglip | tail -24
pack
echo "elapsed $((SECONDS - T0)) s"
