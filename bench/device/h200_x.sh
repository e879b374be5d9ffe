# 1 x H200 (counts half): the vitb32 preset end to end through launch/pretrain.py from rendered-scene
# JPEG shards on disk, against synthetic batches in the same call, now that the patch embedding is
# a GEMM (the step is ~1.17x faster: does the loader keep up?).
source bench/device/env.sh
R=/tmp/x; mkdir -p $R
timeout $(left 540) python bench/bench_e2e.py --preset ds_configs/vitb32.json --workers 12 --steps 60 --dir /tmp/e2e \
    --out $R/e2e.jsonl > $R/e2e.log 2>&1
cp /tmp/e2e/*.log $R/ 2>/dev/null; pack
tail -3 $R/e2e.log; echo "elapsed $((SECONDS - T0)) s"
