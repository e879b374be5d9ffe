# 1 x H200 (counts part), review of the session's change: the two gradient consumers' tile (wgmma in its turn, offsets)
# and P's store in shared helpers (_tile_acc, _store_tile), the three Gluon launches' failover in one (_gluon_launch).
# The blocks' times (bench/diag_gluon_grad.py --siglip; h200_gh: CLIP 0.055 / 0.105 ms, SigLIP 0.067 / 0.131 at 32k /
# 65k) and the Gluon GPU tests (h200_gi: 70 pass).
source bench/device/env.sh
R=/tmp/gk; mkdir -p $R
timeout $(left 90) python bench/diag_gluon_grad.py --siglip > $R/gluon_grad_siglip_gk_h200.log 2>&1
cat $R/gluon_grad_siglip_gk_h200.log
pack
timeout $(left 400) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_gk.log 2>&1
tail -3 $R/gpu_tests_gluon_gk.log
pack
echo "elapsed $((SECONDS - T0)) s"
