# 1 x H200 (counts part), issue 11 (idle GPU at 32k): the backward's block views made once per band / column /
# shape and the Gluon kernel's checks and TMA descriptors kept per call (ops/contrastive_loss_triton._grad_bands,
# _gluon_grad). The op's GPU tests; then, alternating old (the previous commit's two files, in a copy of the tree
# under /tmp/old) and new, the host's microseconds per block (diag_block_host.py) and the host's time to issue
# a call against its GPU span at 32k / 65k (diag_loss_host.py); then the idle bench at 32k / 65k, interleaved.
# (bench/device/old_ops/ held, for this call only, the two files as of commit aee82a3: git show aee82a3:ops/...)
source bench/device/env.sh
R=/tmp/em; mkdir -p $R
rm -rf /tmp/old && mkdir /tmp/old && cp -r ops pipeline eval infclip bench /tmp/old/ && cp bench/device/old_ops/*.py /tmp/old/ops/
timeout $(left 230) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_block_views.log 2>&1
tail -3 $R/gpu_tests_ops_block_views.log
pack
for round in 1 2; do
  for tree in /tmp/old $PWD; do
    label=$([ $tree = /tmp/old ] && echo old || echo new)
    (cd $tree && timeout 60 python bench/diag_block_host.py --reps 200 2>&1 | tail -6 | sed "s/^/$label: /") >> $R/block_host_ab_h200.log
    (cd $tree && timeout 60 python bench/diag_loss_host.py --sizes 32768,65536 --calls 1 2>&1 | grep "host ms to issue" | sed "s/^/$label: /") >> $R/loss_host_ab_h200.log
  done
done
cat $R/block_host_ab_h200.log $R/loss_host_ab_h200.log | cut -c1-150
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --interleave 40 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_block_views_idle_32k_65k.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_block_views_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
