# 1 x H200 (counts half): where the loss op's host time goes (cProfile of 20 forward + backward
# calls, bench_contrastive_loss.py --host-profile) at B = 1,024 and 16,384.
source bench/device/env.sh
R=/tmp/ai; mkdir -p $R
for b in 1024 16384; do
  timeout $(left 250) python bench/bench_contrastive_loss.py --sizes $b --big "" --reps 5 --anchors compiled_dense \
      --host-profile $b --out $R/cl.jsonl > $R/host_profile_$b.log 2>&1
done
pack
for b in 1024 16384; do grep -v "^{" $R/host_profile_$b.log | head -60; done; echo "elapsed $((SECONDS - T0)) s"
