# 1 x H200 (counts part): the loss op with fewer launches per call at small B (issue 11: SigLIP
# 1.5x / 1.2x the compiled dense loss at 1k / 2k, launch-bound). GPU tests of the op, then the op
# against the compiled dense losses from 1k to 16k behind 20 ms of queued work and on an idle GPU,
# and the kernel tables at 1k (as h200_be).
source bench/device/env.sh
R=/tmp/bi; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -3 $R/gpu_tests_ops.log
pack
timeout $(left 420) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss.jsonl \
    --profile 1024 --profile-out $R/profile_1k.txt > $R/contrastive_loss_q20.log 2>&1
grep "^|" $R/contrastive_loss_q20.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --out $R/contrastive_loss_idle.jsonl > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
