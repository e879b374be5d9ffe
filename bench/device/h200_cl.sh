# 1 x H200 (counts part), issue 11: the op's strip kernel with its masked tiles in loops of their
# own against the unmasked copy; the op's forward / backward apart; the strips' GPU tests; then
# the op against the compiled dense loss, CLIP 1k-65k, queued and idle.
source bench/device/env.sh
R=/tmp/cl; mkdir -p $R
timeout $(left 100) python bench/diag_stats_epilogue.py --sizes 16384,65536 --no-modes \
    --strips 128,128,64,8,4,1,32,0 > $R/stats_strips_loops_h200.log 2>&1
grep "^B=\|^#\|Error" $R/stats_strips_loops_h200.log | head -40
timeout $(left 160) python bench/diag_strips.py --sizes 4096,8192,16384,32768,65536 > $R/strips_fwd_bwd_h200.log 2>&1
grep -v "grad block" $R/strips_fwd_bwd_h200.log
pack
timeout $(left 230) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py -k "strip or grid_clip or paths" > $R/gpu_tests_strips.log 2>&1
tail -3 $R/gpu_tests_strips.log
pack
timeout $(left 450) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss.jsonl \
    --variant "tiles:_STRIPS=False" > $R/contrastive_loss_h200_strips_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_strips_queued20.log | grep -v siglip
pack
echo "elapsed $((SECONDS - T0)) s"
