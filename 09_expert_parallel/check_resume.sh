#!/usr/bin/env bash
# check_resume.sh BINARY RANKS: the checkpoint check of `make check-09` (checks.txt).
#   1. an uninterrupted run of 6 steps at ep RANKS (8 experts)
#   2. the same run stopped after 3 steps with --save (chapter 08's sharded checkpoint: each rank
#      writes its experts' slices and the pieces of the rest it is the one to hold)
#   3. resumed for steps 4-6 on the same mesh: bit-identical losses; on ep 2 x dp_replicate 2, on
#      pp 2 x ep 2 (chapter 05's stages), on ep 2 x cp 2 (chapter 06's), on ep 4 = dp_shard 2 x
#      cp 2 and under chapter 04's FSDP at ep 2 x dp_replicate 2 and at ep 2 over dp_shard 2 x cp 2
#      (the experts sharded over cp) and at ep 2 under --full-shard (each expert over the 2 ranks
#      beside ep) (when RANKS is 4), and on one rank, every expert there: within 1e-5 relative
#   4. (RANKS 4) a checkpoint saved under FSDP over dp_shard 2 x cp 2 at ep 2 (the dense tensors'
#      shards over 4 ranks, each expert's over the 2 cp ranks that hold it), resumed at ep 4:
#      within 1e-5
#   5. a checkpoint of 8 experts refused by a model of 4, in one line
set -u
bin=$1; np=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
model="--experts 8 --top-k 2 --batch 8"
fail() { echo "FAIL: $*"; exit 1; }
run() {   # run NAME RANKS FLAGS...: output in $tmp/NAME.txt, exit status returned
    local name=$1 n=$2; shift 2
    $MPIRUN_BASE -np "$n" "$bin" --out "$tmp/$name.out" $model "$@" >"$tmp/$name.txt" 2>&1
}
losses() { sed -nE 's/^step +([0-9]+) \| loss [^|]* ([0-9.]+) \|.*/\1 \2/p' "$tmp/$1.txt"; }   # step loss
run a "$np" --steps 6 || { tail -5 "$tmp/a.txt"; fail "the uninterrupted run"; }
run b "$np" --steps 3 --save "$tmp/ckpt" || { tail -5 "$tmp/b.txt"; fail "the run that saves"; }
[ "$(cat "$tmp/ckpt/latest")" = step_00000003 ] || fail "latest is '$(cat "$tmp/ckpt/latest")', not step_00000003"
run same "$np" --steps 3 --resume "$tmp/ckpt" || { tail -5 "$tmp/same.txt"; fail "resumed on the same mesh"; }
diff <(losses a | tail -3) <(losses same) >/dev/null || { diff <(losses a | tail -3) <(losses same); fail "same mesh: not bit-identical"; }
echo "same mesh (ep $np): steps 4-6 bit-identical: $(losses same | awk '{print $2}' | tr '\n' ' ')"
others=("1|--ep 1"); [ "$np" = 4 ] && others+=("4|--ep 2" "4|--pp 2" "4|--cp 2" "4|--cp 2 --ep-over-cp" "4|--fsdp --ep 2" "4|--fsdp --cp 2" "4|--fsdp --ep 2 --full-shard")
for other in "${others[@]}"; do
    n=${other%%|*}; flags=${other#*|}
    run other "$n" $flags --steps 3 --resume "$tmp/ckpt" || { tail -5 "$tmp/other.txt"; fail "resumed on $flags"; }
    worst=$(paste -d' ' <(losses a | tail -3) <(losses other) | awk '{ d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.2e", w }')
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || fail "resumed on $flags ($n ranks): losses $worst relative from the uninterrupted run's"
    echo "another mesh ($flags, $n ranks): steps 4-6 within $worst relative"
done
if [ "$np" = 4 ]; then   # saved under FSDP over dp_shard 2 x cp 2 at ep 2 (each rank writes its shards of the dense
                         # tensors and of its experts), resumed at ep 4
    run b2 4 --cp 2 --fsdp --steps 3 --save "$tmp/ckpt2" || { tail -5 "$tmp/b2.txt"; fail "the run that saves over dp_shard x cp"; }
    run back 4 --steps 3 --resume "$tmp/ckpt2" || { tail -5 "$tmp/back.txt"; fail "resumed from the checkpoint of dp_shard x cp"; }
    worst=$(paste -d' ' <(losses a | tail -3) <(losses back) | awk '{ d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.2e", w }')
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || fail "saved over dp_shard x cp, resumed at ep 4: losses $worst relative from the uninterrupted run's"
    echo "saved under FSDP over dp_shard 2 x cp 2 at ep 2 (the experts' shards over cp), resumed at ep 4: steps 4-6 within $worst relative"
fi
run wrong 1 --steps 1 --resume "$tmp/ckpt" --experts 4; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$tmp/wrong.txt")" -eq 1 ] && grep -q "was written for experts 8; this model has experts 4" "$tmp/wrong.txt" ||
    { cat "$tmp/wrong.txt"; fail "a checkpoint of 8 experts loaded by a model of 4: exit $rc"; }
echo "a checkpoint of 8 experts refused by a model of 4: $(cat "$tmp/wrong.txt")"
saved_over=""; [ "$np" = 4 ] && saved_over=", and from one saved under FSDP over dp_shard x cp"
echo "resumed from step 3 at ep $np bit-identically, on ${#others[@]} other meshes within 1e-5$saved_over; a model of 4 experts refused the checkpoint of 8"
