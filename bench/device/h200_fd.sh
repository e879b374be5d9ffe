# 1 x H200 (counts part): the three block diagnostics after their shared setup moved into bench/diag_gluon_grad.py
# (FirstBlock, captured): each runs and gives h200_es / h200_ez's figures again.
source bench/device/env.sh
R=/tmp/fd; mkdir -p $R
(timeout 120 python bench/diag_gluon_grad.py --sizes 32768,65536 --reps 5
 timeout 120 python bench/diag_block_power.py --sizes 65536 --seconds 2
 timeout 120 python bench/diag_launch_host.py --b 32768 --reps 10) 2>&1 | grep -v "leaked\|nanobind\|^ - " > $R/diag_refactor_check_h200.log
cat $R/diag_refactor_check_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
