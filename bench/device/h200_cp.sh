# 1 x H200 (counts part), issue 11: where the CLIP gradient kernel's time goes (bench/diag_grad_epilogue.py:
# the op's kernel against copies without parts of its epilogue, cuBLAS's GEMM, the unfused block), 65k.
source bench/device/env.sh
R=/tmp/cp; mkdir -p $R
timeout $(left 420) python bench/diag_grad_epilogue.py --sizes 65536 --tiles 128,256,64,8,8,3,1 \
    > $R/grad_epilogue_h200.log 2>&1
grep "^B=\|^#\|Error" $R/grad_epilogue_h200.log | cut -c1-150 | head -60
pack
echo "elapsed $((SECONDS - T0)) s"
