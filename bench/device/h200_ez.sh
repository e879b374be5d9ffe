# 1 x H200 (counts part), issue 11 (the eager backward's host time a gradient block: the Gluon launch ~38 us of ~100):
# the launch's host time by part (bench/diag_launch_host.py): the whole call, Triton's binding + cache lookup alone,
# the compiled kernel's launcher alone, the cached descriptors' lookup, one torch.mm, at 32k and 65k.
source bench/device/env.sh
R=/tmp/ez; mkdir -p $R
for b in 32768 65536; do
  timeout $(left 200) python bench/diag_launch_host.py --b $b >> $R/launch_host_h200.log 2>&1
done
grep -v "leaked\|nanobind\|^ - " $R/launch_host_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
