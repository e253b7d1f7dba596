#!/usr/bin/env bash
# check_resume.sh BINARY RANKS: the checkpoint checks of `make check-08` (checks.txt).
#   1. a run on mesh A (RANKS ranks: pp 2 x dp_shard 2 x tp 2 at 8) saves checkpoints at steps 3 and 6
#   2. resumed from step 3 on the same mesh: steps 4-6 have bit-identical losses (metrics.csv)
#   3. resumed from step 3 on pp 2 x tp 2 (4 ranks) and on one rank: within 1e-5 relative
#   3b. across FSDP's two shardings (at 8 ranks): mesh A's checkpoint (shards over dp_shard)
#      resumed on dp_shard 2 x cp 2 x tp 2 (shards over dp_shard x cp, the default); a run there
#      saving step 3 with the shards over dp_shard x cp, resumed with --no-fsdp-over-cp: within 1e-5
#   4. a save killed before its rename (the test hook CKPT_TEST_CRASH_BEFORE_RENAME) leaves the
#      previous checkpoint as DIR/latest names it, and no step directory of its own
set -u
bin=$1; np=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small="--dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 6 --eval-every 3 --eval-batches 2"
case $np in 8) mesh_a="--pp 2 --dp-shard 2 --tp 2";; 4) mesh_a="--dp-shard 2 --tp 2";; *) mesh_a="--dp-shard -1";; esac
fail() { echo "FAIL: $*"; exit 1; }
run() {   # run NAME RANKS FLAGS...: out in $tmp/NAME.out, exit status returned
    local name=$1 n=$2; shift 2
    $MPIRUN_BASE -np "$n" "$bin" --out "$tmp/$name.out" $small "$@" >"$tmp/$name.txt" 2>&1
}
losses() { tail -n +2 "$tmp/$1.out/metrics.csv" | cut -d, -f1-3; }   # step,loss,val_loss

run a "$np" $mesh_a --ckpt-dir "$tmp/ckpt" --ckpt-every 3 || { tail -5 "$tmp/a.txt"; fail "the uninterrupted run"; }
[ "$(cat "$tmp/ckpt/latest")" = step_00000006 ] || fail "latest is '$(cat "$tmp/ckpt/latest")', not step_00000006"
# a directory whose latest is step 3's checkpoint (of $tmp/ckpt, or of the directory given second)
from3() { mkdir -p "$tmp/$1"; cp -r "$tmp/${2:-ckpt}/step_00000003" "$tmp/$1/"; echo step_00000003 >"$tmp/$1/latest"; }
# the worst relative difference of steps 4-6's losses between the run REF and the resumed run NAME
worst_of() {
    paste -d, <(losses "$1" | tail -3) <(losses "$2") | awk -F, '
        { for (c = 2; c <= 3; c++) { r = $c; g = $(c + 3); if (r == "nan" && g == "nan") continue
          d = (r - g) / (r < 0 ? -r : r); if (d < 0) d = -d; if (d > w) w = d } } END { printf "%.2e", w }'
}

from3 same
run same "$np" $mesh_a --ckpt-dir "$tmp/same" --resume || { tail -5 "$tmp/same.txt"; fail "the resumed run"; }
diff <(losses a | tail -3) <(losses same) >/dev/null || { diff <(losses a | tail -3) <(losses same); fail "same mesh: not bit-identical"; }
echo "same mesh ($mesh_a): steps 4-6 bit-identical: $(losses same | tr '\n' ' ')"

others=("4|--pp 2 --tp 2 --dp-shard 1" "1|--dp-shard 1")
[ "$np" = 8 ] && others+=("8|--dp-shard 2 --cp 2 --tp 2")   # FSDP's shards now over dp_shard x cp
for other in "${others[@]}"; do
    n=${other%%|*}; flags=${other#*|}
    name=other_$n; from3 "$name"
    run "$name" "$n" $flags --ckpt-dir "$tmp/$name" --resume || { tail -5 "$tmp/$name.txt"; fail "resumed on $flags"; }
    worst=$(worst_of a "$name")
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || fail "resumed on $flags ($n ranks): losses $worst relative from the uninterrupted run's"
    echo "another mesh ($flags, $n ranks): steps 4-6 within $worst relative"
done

if [ "$np" = 8 ]; then   # the other way: saved with the shards over dp_shard x cp, resumed over dp_shard
    mesh_cp="--dp-shard 2 --cp 2 --tp 2"
    run cp "$np" $mesh_cp --ckpt-dir "$tmp/ckpt_cp" --ckpt-every 3 || { tail -5 "$tmp/cp.txt"; fail "the run on $mesh_cp"; }
    from3 cp_old ckpt_cp
    run cp_old "$np" $mesh_cp --no-fsdp-over-cp --ckpt-dir "$tmp/cp_old" --resume ||
        { tail -5 "$tmp/cp_old.txt"; fail "resumed with --no-fsdp-over-cp"; }
    worst=$(worst_of cp cp_old)
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' ||
        fail "saved over dp_shard x cp, resumed over dp_shard: losses $worst relative from the uninterrupted run's"
    echo "another sharding ($mesh_cp, saved over dp_shard x cp, resumed with --no-fsdp-over-cp): steps 4-6 within $worst relative"
fi

from3 crash
CKPT_TEST_CRASH_BEFORE_RENAME=1 run crash "$np" $mesh_a --ckpt-dir "$tmp/crash" --resume --ckpt-every 3
rc=$?
[ $rc -ne 0 ] || fail "the save with the crash hook did not end the run"
[ "$(cat "$tmp/crash/latest")" = step_00000003 ] && [ ! -e "$tmp/crash/step_00000006" ] ||
    fail "after a killed save: latest '$(cat "$tmp/crash/latest")', step_00000006 $( [ -e "$tmp/crash/step_00000006" ] && echo exists || echo absent)"
run again "$np" $mesh_a --ckpt-dir "$tmp/crash" --resume || { tail -5 "$tmp/again.txt"; fail "resuming after the killed save"; }
diff <(losses a | tail -3) <(losses again) >/dev/null || fail "after the killed save: not bit-identical"
echo "a save killed before its rename (exit $rc): step 3's checkpoint still loads, steps 4-6 bit-identical"
echo "resume: bit-identical on the same mesh, within 1e-5 on other meshes and across FSDP's two shardings; a killed save leaves the last checkpoint"
