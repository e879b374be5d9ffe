# 1 x H200 (counts part), issue 11: a prototype of the CLIP gradient block with the column block of B resident in
# shared memory (the forward sums' loader and turn loop; P stored from the registers, 400 bytes of spill in a local
# 3.9 build), checked against the op's Triton kernel and timed against the op's Gluon block, alone and followed by
# the two gradient GEMMs (bench/device/tmp_resident_grad.py, device-only). h200_gp: the same with P not stored.
source bench/device/env.sh
R=/tmp/go; mkdir -p $R
timeout $(left 300) python bench/device/tmp_resident_grad.py > $R/gluon_resident_grad_go_h200.log 2>&1
cat $R/gluon_resident_grad_go_h200.log | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
