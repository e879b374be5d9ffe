# 1 x H100 (no H200 was free; counts part): where a replayed loss call's time goes on an idle GPU
# (bench/diag_replay_host.py).
source bench/device/env.sh
R=/tmp/ec; mkdir -p $R
timeout $(left 250) python bench/diag_replay_host.py --sizes 1024,2048,8192 --calls 200 > $R/replay_host_h100.log 2>&1
grep "^B=" $R/replay_host_h100.log
pack
