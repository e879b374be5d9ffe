# 1 x H200 (counts part), issue 11 (CLIP at 32k, 1.35-1.39x the roofline within 193 MiB): the backward's block shape.
# 8,192 x 4,096 blocks gave 1.25x at 32k but hold 233 MiB (h200_gj), the time saved being the cuBLAS gradient GEMMs'
# (larger GEMMs, h200_fy). Blocks with P no larger than 4,096 x 4,096's 32 MiB and a smaller fp32 row sum: 2,048 x
# 8,192 and 1,024 x 16,384; with larger P for reference 2,048 x 16,384, 4,096 x 8,192 and 8,192 x 4,096. The op behind
# 20 ms of queued work at 16k / 32k, CLIP and SigLIP, each shape a variant in the same process (peaks in the jsonl).
source bench/device/env.sh
R=/tmp/hm; mkdir -p $R
timeout $(left 520) python bench/bench_contrastive_loss.py --sizes 16384,32768 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_blocks.jsonl --variant-siglip \
    --variant "b2x8:_GRAD_BLOCKS=((2048,8192),)" --variant "b1x16:_GRAD_BLOCKS=((1024,16384),)" \
    --variant "b2x16:_GRAD_BLOCKS=((2048,16384),)" --variant "b4x8:_GRAD_BLOCK=(4096,8192);_GRAD_FACTOR=2.0" \
    --variant "b8x4:_GRAD_FACTOR=2.0" > $R/contrastive_loss_h200_block_shapes_queued20.log 2>&1
grep "^|\|rror" $R/contrastive_loss_h200_block_shapes_queued20.log
python - $R/contrastive_loss_blocks.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['B']:>6} {r['impl']:<26} {r.get('ms')} ms  x{r.get('x_roofline')}  peak {r.get('peak_extra_gib', 0) * 1024:.1f} MiB")
PY
pack
echo "elapsed $((SECONDS - T0)) s"
