# 2 x H200 (counts in full): the schemes' scaling with the size check on the host, measured both
# ways: each call on an idle GPU (as before), and behind 20 ms of queued GPU work (as in training,
# the loss after the towers' forward), the 1-GPU op on the whole batch timed the same way.
source bench/device/env.sh
R=/tmp/x2g; mkdir -p $R
for q in 20 0; do
  timeout $(left 280) torchrun --nproc_per_node 2 bench/bench_distributed.py --batches 32768 65536 131072 \
      --schemes disco ring hierarchical_ring --queued-ms $q --out $R/distributed.jsonl > $R/distributed_x2_q$q.log 2>&1
  pack
done
for q in 20 0; do echo "queued $q ms"; grep -A13 "^scheme" $R/distributed_x2_q$q.log; done; echo "elapsed $((SECONDS - T0)) s"
