# 1 x H200 (counts part), issue 11: h200_em again after the fix of its peak (the TMA descriptors kept for the
# blocks of one call held a view of P's buffer past the block loop: 0.22 / 0.44 GiB at 32k / 65k). The op's GPU
# tests (with the new peak-memory test), the host's time to issue a call against its GPU span, old (the
# previous commit's two files, /tmp/old) and new alternating, then the idle bench at 32k / 65k, interleaved.
# (bench/device/old_ops/ held, for this call only, the two files as of commit aee82a3: git show aee82a3:ops/...)
source bench/device/env.sh
R=/tmp/en; mkdir -p $R
rm -rf /tmp/old && mkdir /tmp/old && cp -r ops pipeline eval infclip bench /tmp/old/ && cp bench/device/old_ops/*.py /tmp/old/ops/
timeout $(left 230) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_block_memo.log 2>&1
tail -3 $R/gpu_tests_ops_block_memo.log
pack
for round in 1 2; do
  for tree in /tmp/old $PWD; do
    label=$([ $tree = /tmp/old ] && echo old || echo new)
    (cd $tree && timeout 60 python bench/diag_loss_host.py --sizes 32768,65536 --calls 1 2>&1 | grep "host ms to issue" | sed "s/^/$label: /") >> $R/loss_host_ab_h200.log
  done
done
cut -c1-110 $R/loss_host_ab_h200.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --interleave 40 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_block_memo_idle_32k_65k.log 2>&1
grep "^|\|^# interleaved" $R/contrastive_loss_h200_block_memo_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
