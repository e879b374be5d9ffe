# 1 x H200 (counts part), issue 11: the CUDA-graph replay's memory (ops/graphs.py: one pool and one warm-up
# stream per device for all captures, replays ordered across streams): what the captures keep and how it grows
# with new shapes, before (a pool and a side stream per capture, emulated) and now, each in its own process;
# whether the two-stream test can fail (the cache's wait removed); the replay tests and the op's GPU tests.
source bench/device/env.sh
R=/tmp/cz; mkdir -p $R
timeout $(left 120) python bench/diag_graph_memory.py --previous > $R/graph_memory_previous_h200.log 2>&1
timeout $(left 240) python bench/diag_graph_memory.py > $R/graph_memory_shared_h200.log 2>&1
cat $R/graph_memory_previous_h200.log $R/graph_memory_shared_h200.log
pack
timeout $(left 300) python - > $R/graph_order_without_wait_h200.log 2>&1 <<'PY'
import torch, tests.ops.test_graphs_gpu as t
from infclip.ops import graphs
class NoWait(dict):
    def get(self, key, default=None):
        return None
orig = graphs.GraphCache.__init__
def init(self, size=8):
    orig(self, size); self.last_stream = NoWait()
graphs.GraphCache.__init__ = init
t.GraphCache = graphs.GraphCache
fails = 0
for _ in range(20):
    try:
        t.test_replays_on_two_streams_do_not_overlap()
    except AssertionError as e:
        fails += 1
print(f"without the cache's wait: {fails} of 20 runs of the two-stream test failed")
PY
cat $R/graph_order_without_wait_h200.log | tail -3
timeout $(left 420) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
timeout $(left 580) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
