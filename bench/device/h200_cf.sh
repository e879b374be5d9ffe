# 1 x H200 (counts part): where an eager call of the loss op spends its host time on an idle GPU at
# 8k / 16k (bench/diag_loss_host.py: host waits, cProfile).
source bench/device/env.sh
R=/tmp/cf; mkdir -p $R
timeout $(left 200) python bench/diag_loss_host.py --sizes 8192,16384 > $R/loss_host_h200.log 2>&1
pack
grep "^# B\|^#   " $R/loss_host_h200.log; head -c 9000 $R/loss_host_h200.log | tail -c 6000; echo "elapsed $((SECONDS - T0)) s"
