# 1 x H200 (counts part), issue 11, again after h200_fa (its direct launches never engaged: Triton 3.6's launch hooks are empty
# chains, not None; fixed), (idle GPU at 32k: SigLIP 1.02-1.05x, h200_ey; a Gluon launch's host time: Triton's
# binding + lookup 21-28 us, its launcher 14-21, h200_ez): the per-block kernels now launch through ops/launch.py
# (the compiled kernel's launcher called directly after the first launch of a key). The op's GPU tests (with two new
# ones for the direct launches); the launch's host time again; the host's time to issue a call, old (HEAD's two files,
# bench/device/old_ops/ for this call only) and new alternating; the idle bench at 32k / 65k.
source bench/device/env.sh
R=/tmp/fc; mkdir -p $R
rm -rf /tmp/old && mkdir /tmp/old && cp -r ops pipeline eval infclip bench /tmp/old/ && cp bench/device/old_ops/*.py /tmp/old/ops/ \
  && rm /tmp/old/ops/launch.py
timeout $(left 250) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_direct_launch.log 2>&1
tail -3 $R/gpu_tests_ops_direct_launch.log
pack
timeout 60 python bench/diag_launch_host.py --b 32768 2>&1 | grep -v "leaked\|nanobind\|^ - " > $R/launch_host_direct_h200.log
cat $R/launch_host_direct_h200.log
for round in 1 2; do
  for tree in /tmp/old $PWD; do
    label=$([ $tree = /tmp/old ] && echo old || echo new)
    for loss in clip siglip; do
      (cd $tree && timeout 60 python bench/diag_loss_host.py --loss $loss --sizes 32768,65536 --calls 1 2>&1 | grep "host ms to issue" | sed "s/^/$label $loss: /") >> $R/loss_host_direct_ab_h200.log
    done
  done
done
cut -c1-120 $R/loss_host_direct_ab_h200.log
pack
timeout $(left 570) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --interleave 60 --interleave-max 65536 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_direct_idle_32k_65k.log 2>&1
grep "^# NVIDIA\|^# interleaved" $R/contrastive_loss_h200_direct_idle_32k_65k.log
pack
echo "elapsed $((SECONDS - T0)) s"
