# 1 x H200 (counts part): the loss op's forward + backward on an idle GPU, eager against the same
# replayed as one CUDA graph (bench/diag_loss_graph.py), B = 1k-16k, with the compiled dense loss.
source bench/device/env.sh
R=/tmp/bu; mkdir -p $R
timeout $(left 300) python bench/diag_loss_graph.py --sizes 1024,2048,4096,8192,16384 > $R/loss_graph_h200.log 2>&1
pack
grep -v "^ \|Warning\|warn" $R/loss_graph_h200.log | tail -30; echo "elapsed $((SECONDS - T0)) s"
