# 1 x H200 (counts half): kernel tables of the loss op (TMA kernels) and the compiled dense loss
# at B = 16k and 32k (bench_contrastive_loss.py --profile): where the backward's time goes.
source bench/device/env.sh
R=/tmp/ag; mkdir -p $R
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 16384,32768 --big "" --reps 7 \
    --anchors compiled_dense --profile 16384,32768 --profile-out $R/profile.txt --out $R/cl.jsonl > $R/cl.log 2>&1
pack
grep "^|" $R/cl.log; cat $R/profile.txt | cut -c1-200; echo "elapsed $((SECONDS - T0)) s"
