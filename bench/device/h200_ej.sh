# 1 x H200 (counts part): is the op's eager call at 16k-65k paced by its host on an idle GPU (h200_eh: runs of
# 18-20 ms calls at 32k against 13)? Host ms to issue a call against its GPU span, then where the host's
# time goes (bench/diag_loss_host.py).
source bench/device/env.sh
R=/tmp/ej; mkdir -p $R
timeout $(left 300) python bench/diag_loss_host.py --sizes 16384,32768,65536 --calls 5 > $R/loss_host_16k_65k_h200.log 2>&1
grep "^# B" $R/loss_host_16k_65k_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
