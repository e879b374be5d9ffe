# Source on the device machine (repo root): the wheels carried in .whl/, the prebuilt FusedAdam in .tex/
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=$PWD/.tex/tex NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
touch .tex/tex/fused_adam/*.o .tex/tex/fused_adam/*.so 2>/dev/null || true
# zero-shot on the held-out colour and count splits (2 shards each) of a finished run's export:
#   zeroshot_splits RUN_DIR SCENES_DIR LOG_DIR SECONDS_PER_SPLIT
zeroshot_splits() {
  for sp in colour count; do
    timeout $4 python launch/zeroshot.py --checkpoint $1/final --shards "$2/zeroshot_$sp/shard-{000000..000001}.tar" \
        --classnames $2/zeroshot_$sp/classnames.txt --templates $2/zeroshot_$sp/templates.txt \
        --out $1/eval/zs_$sp.json > $3/zs_$sp.log 2>&1
  done
}
# the call's clock and results: left N = seconds until second N of the call; pack [RUN_DIR...] copies
# each run's tb/ and eval/ into the results folder $R (/tmp/<name>, set by the script) and tars $R to
# $OUT/<name>.tgz (at most 8 files come back from a call: one tar, rewritten after each phase)
T0=$SECONDS
left() { echo $(( $1 - (SECONDS - T0) )); }
pack() {
  for d in "$@"; do [ -d $d ] && mkdir -p $R/$d && cp -r $d/tb $d/eval $R/$d/ 2>/dev/null; done
  tar czf $OUT/$(basename $R).tgz -C $(dirname $R) $(basename $R)
}
