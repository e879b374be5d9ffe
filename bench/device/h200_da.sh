# 1 x H200 (counts part), issue 11: h200_cz again after its fixes (the shared pool taken from a graph the cache
# holds, not a stored id, which torch frees with the cache's last graph; warm-ups on the caller's stream): the
# captures' memory before (emulated) and now, each in its own process; the two-stream test 20 times with and
# without the cache's wait; the replay tests.
source bench/device/env.sh
R=/tmp/da; mkdir -p $R
timeout $(left 120) python bench/diag_graph_memory.py --previous > $R/graph_memory_previous_h200.log 2>&1
timeout $(left 240) python bench/diag_graph_memory.py > $R/graph_memory_shared_h200.log 2>&1
cat $R/graph_memory_previous_h200.log $R/graph_memory_shared_h200.log | grep -v Warn
pack
for mode in wait nowait; do
timeout $(left 330) python - $mode > $R/graph_order_${mode}_h200.log 2>&1 <<'PY'
import sys, torch, tests.ops.test_graphs_gpu as t
from infclip.ops import graphs
class NoWait(dict):
    def get(self, key, default=None):
        return None
if sys.argv[1] == "nowait":
    orig = graphs.GraphCache.__init__
    def init(self, size=8):
        orig(self, size); self.last_stream = NoWait()
    graphs.GraphCache.__init__ = init
fails = 0
for _ in range(20):
    try:
        t.test_replays_on_two_streams_do_not_overlap()
    except AssertionError as e:
        fails += 1
print(f"{sys.argv[1]}: {fails} of 20 runs of the two-stream test failed")
PY
tail -1 $R/graph_order_${mode}_h200.log
done
timeout $(left 450) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
echo "elapsed $((SECONDS - T0)) s"
