# 1 x H200 (counts part), issue 11, the final strips (from B ~11.6k, masked tiles in loops of their
# own): the op's GPU tests; the op against the compiled dense losses, CLIP and SigLIP 1k-65k,
# behind 20 ms of queued work and on an idle GPU ("tiles": the per-tile forward, _STRIPS=False);
# the peak at 65k.
source bench/device/env.sh
R=/tmp/cm; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    --variant "tiles:_STRIPS=False" > $R/contrastive_loss_h200_strips_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_strips_queued20.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_strips_idle.log 2>&1
grep "^|" $R/contrastive_loss_h200_strips_idle.log
pack
timeout $(left 590) python bench/diag_loss_memory.py --b 65536 > $R/loss_memory_65k_strips_h200.log 2>&1
grep -E "^B=" $R/loss_memory_65k_strips_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
