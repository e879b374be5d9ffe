# 1 x H200 (counts half): is the loss op host-bound? (bench/diag_host_gap.py: steady wall time,
# device time with the host far ahead, host enqueue time per forward + backward)
source bench/device/env.sh
R=/tmp/ah; mkdir -p $R
timeout $(left 300) python bench/diag_host_gap.py --sizes 1024,2048,4096,8192,16384,32768,65536 > $R/host_gap.log 2>&1
pack
cat $R/host_gap.log; echo "elapsed $((SECONDS - T0)) s"
