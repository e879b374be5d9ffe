# 1 x H200 (counts part), issue 11 (idle GPU at 32k: SigLIP 1.16x interleaved in h200_eo): SigLIP's gradient
# blocks (its forward takes them) now also keep their row slices and TMA descriptors per call (_BlockMemo in
# _fused). The op's GPU tests; the host's time to issue a SigLIP call against its GPU span, old (commit 7cd02d7's
# two files, bench/device/old_ops/ for this call only) and new alternating; the idle bench at 32k / 65k.
# (bench/device/old_ops/ held, for this call only, the two files as of commit 7cd02d7: git show 7cd02d7:ops/...)
source bench/device/env.sh
R=/tmp/ep; mkdir -p $R
rm -rf /tmp/old && mkdir /tmp/old && cp -r ops pipeline eval infclip bench /tmp/old/ && cp bench/device/old_ops/*.py /tmp/old/ops/
timeout $(left 230) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_siglip_memo.log 2>&1
tail -3 $R/gpu_tests_ops_siglip_memo.log
pack
for round in 1 2; do
  for tree in /tmp/old $PWD; do
    label=$([ $tree = /tmp/old ] && echo old || echo new)
    (cd $tree && timeout 60 python bench/diag_loss_host.py --loss siglip --sizes 32768,65536 --calls 1 2>&1 | grep "host ms to issue" | sed "s/^/$label: /") >> $R/loss_host_siglip_ab_h200.log
  done
done
cut -c1-110 $R/loss_host_siglip_ab_h200.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --interleave 60 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_siglip_memo_idle_32k_65k.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_siglip_memo_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
