# 1 x H200 (counts part), issue 11: the CLIP forward's plain sums by column strips with d scale
# summed by the backward (the default on Hopper now) against the per-tile forward with its
# weighted sums ("tiles": _STRIPS=False) and two strip variants, CLIP 1k-65k behind 20 ms of
# queued work and on an idle GPU, against the compiled dense loss; the peak at 65k; the GPU tests.
source bench/device/env.sh
R=/tmp/ci; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py -k "strip or large_batch or 262144" > $R/gpu_tests_strips.log 2>&1
tail -3 $R/gpu_tests_strips.log
pack
timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss.jsonl \
    --variant "tiles:_STRIPS=False" --variant "c64:_TMA_STRIPS=(128,128,64,8,4,1,64)" \
    --variant "k5:_TMA_STRIPS=(128,128,64,8,5,1,32)" \
    > $R/contrastive_loss_h200_strips_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_strips_queued20.log
pack
timeout $(left 500) python bench/diag_loss_memory.py --b 65536 > $R/loss_memory_65k_strips_h200.log 2>&1
grep -E "^B=" $R/loss_memory_65k_strips_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
