#!/usr/bin/env bash
# compare_outputs.sh BASE_COMMIT [COMMANDS_FILE]: does this working tree print and write exactly
# what BASE_COMMIT did? A developer's tool for refactorings that must change nothing a run shows
# (not part of `make test`: it builds a second tree and runs every command twice, minutes).
#
#   1. BASE_COMMIT is checked out in its own worktree ($COMPARE_DIR/base, kept between calls)
#      and built there (CPU backend, its own build folder); this tree is built with `make all`.
#   2. Every command of the list (below, or COMMANDS_FILE: one a line, '#' comments) runs in
#      each tree's root under bash, with
#         $MPI  the mpirun prefix (tools/mpirun_base.sh)      $BIN  that tree's build/cpu
#         $OUT  an empty scratch folder, the SAME path for both trees (paths print the same)
#      A line may chain commands (a run, then its resume).
#   3. Compared, byte for byte: the exit status, stdout, stderr, and every file left under $OUT
#      (CSVs, --dump's safetensors, checkpoints, exports). Only what depends on the clock is
#      blanked first: "N ms", "tok/s", "MFU", "GFLOP/s", the "time per step" line, and the
#      time columns of the CSVs (*_ms; chapter 08's tokens_per_s and mfu) and the pipeline's
#      measured idle share. A directory's .lock file is not compared (whether a failed run's
#      rank 0 removed it before mpirun ended it is a race).
#
# Exit status: 0 when every command matched, 1 when any differed (each difference shown, its first 40 lines),
# 2 on a usage or build error. The base tree's outputs are cached per (commit, command), so a
# second comparison against the same commit runs only this tree's side (raw outputs under
# $COMPARE_DIR/raw; the clock is blanked when comparing).
#   COMPARE_DIR   where the base worktree, its build and the outputs live
#                 (default ${TMPDIR:-/tmp}/compare_outputs)
#   JOBS          make -j (default 2)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: tools/compare_outputs.sh BASE_COMMIT [COMMANDS_FILE]" >&2; exit 2; }
base_sha=$(git -C "$here" rev-parse --verify "$1^{commit}" 2>/dev/null) || { echo "not a commit: $1" >&2; exit 2; }
commands_file=${2:-}
dir=${COMPARE_DIR:-${TMPDIR:-/tmp}/compare_outputs}
jobs=${JOBS:-2}
mkdir -p "$dir" || exit 2
base_tree=$dir/base-${base_sha:0:12}

default_commands() {
cat <<'EOF'
# chapters 01-06 as `make run-NN` runs them: 2 ranks, --check, their default sizes
$MPI -np 2 $BIN/01 --check --out $OUT/out
$MPI -np 2 $BIN/02 --check --out $OUT/out
$MPI -np 2 $BIN/03 --check --out $OUT/out
$MPI -np 2 $BIN/04 --check --out $OUT/out
$MPI -np 2 $BIN/05 --check --out $OUT/out
$MPI -np 2 $BIN/06 --check --out $OUT/out
# every gradient every step, clipping, a dump, a deliberate bug (exit 1)
$MPI -np 2 $BIN/01 --check --verbose-grads --clip-grad-norm 0.5 --steps 3 --out $OUT/out --dump $OUT/dump
$MPI -np 2 $BIN/01 --check --fault skip-backward-allreduce --steps 2 --out $OUT/out
$MPI -np 4 $BIN/04 --check --dp-shard 2 --tp 2 --steps 3 --out $OUT/out --dump $OUT/dump
# chapter 07: each recipe beside its float8 baseline, FSDP with float8 all-gathers, a dump
$MPI -np 2 $BIN/07 --check --out $OUT/out
$MPI -np 2 $BIN/07 --check --fp8 rowwise --steps 3 --out $OUT/out --dump $OUT/dump
$MPI -np 2 $BIN/07 --check --fp8 delayed --steps 3 --out $OUT/out
$MPI -np 4 $BIN/07 --check --dp-shard 2 --fp8-all-gather --steps 3 --out $OUT/out
# chapter 08 beside the baseline: a 3-D mesh, accumulation with the interleaved schedule, float8
$MPI -np 8 $BIN/08 --check --dp-shard 2 --tp 2 --pp 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 3 --out $OUT/out
$MPI -np 8 $BIN/08 --check --pp 2 --virtual-stages 2 --schedule interleaved --dp-shard 2 --tp 2 --ac selective --accum 2 --dim 64 --n-layers 4 --seq-len 32 --batch 8 --steps 3 --out $OUT/out
$MPI -np 4 $BIN/08 --check --pp 2 --dp-shard 2 --fp8 tensorwise --eval-every 0 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 3 --out $OUT/out
$MPI -np 8 $BIN/08 --check --dp-shard 2 --tp 2 --pp 2 --fault skip-grad-reduce --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 2 --out $OUT/out
# chapter 08's dumps (tests/t_dump_torch.sh's runs): the lr schedule and clipping; float8 with accumulation
$MPI -np 8 $BIN/08 --dp-shard 2 --cp 2 --tp 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --warmup 2 --clip-grad-norm 0.5 --steps 5 --out $OUT/out --dump $OUT/dump
$MPI -np 4 $BIN/08 --pp 2 --dp-shard 2 --fp8 rowwise --accum 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --warmup 2 --steps 5 --out $OUT/out --dump $OUT/dump
# chapter 08 training: schedule, accumulation, clipping, evaluation, metrics, checkpoints, export,
# sample; then resumed from step 3's checkpoint; then a resume with nothing left to do
$MPI -np 4 $BIN/08 --dp-shard 2 --tp 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 6 --warmup 2 --accum 2 --clip-grad-norm 0.5 --eval-every 3 --eval-batches 2 --ckpt-dir $OUT/ckpt --ckpt-every 3 --export $OUT/model.safetensors --sample 40 --peak-tflops 1 --out $OUT/out && rm -r $OUT/ckpt/step_00000006 && echo step_00000003 > $OUT/ckpt/latest && $MPI -np 2 $BIN/08 --tp 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 6 --warmup 2 --accum 2 --clip-grad-norm 0.5 --eval-every 3 --eval-batches 2 --ckpt-dir $OUT/ckpt --ckpt-every 3 --peak-tflops 1 --out $OUT/out2 --resume && $MPI -np 2 $BIN/08 --tp 2 --dim 64 --n-layers 2 --seq-len 32 --batch 8 --steps 6 --warmup 2 --accum 2 --clip-grad-norm 0.5 --eval-every 3 --eval-batches 2 --ckpt-dir $OUT/ckpt --peak-tflops 1 --out $OUT/out3 --resume
# refusals (exit 2, one line)
$MPI -np 2 $BIN/08 --resume --ckpt-dir $OUT/none --out $OUT/out
$MPI -np 2 $BIN/07 --fp8 rowwise --fp8-all-gather --out $OUT/out
EOF
}
if [ -n "$commands_file" ]; then commands=$(cat "$commands_file") || exit 2; else commands=$(default_commands); fi

# ---- the two builds ----
if [ ! -d "$base_tree" ]; then
    git -C "$here" worktree add --detach "$base_tree" "$base_sha" >/dev/null 2>&1 ||
        { echo "could not check out $base_sha in $base_tree" >&2; exit 2; }
fi
echo "building $base_sha in $base_tree ..."
(cd "$base_tree" && nice make -j"$jobs" all >"$dir/base_build.log" 2>&1) || { tail -20 "$dir/base_build.log"; echo "the base build failed ($dir/base_build.log)" >&2; exit 2; }
echo "building this tree ($here) ..."
(cd "$here" && nice make -j"$jobs" all >"$dir/new_build.log" 2>&1) || { tail -20 "$dir/new_build.log"; echo "this tree's build failed ($dir/new_build.log)" >&2; exit 2; }

MPI=$("$here/tools/mpirun_base.sh")
scratch=$dir/scratch   # $OUT: one path for both trees

# What depends on the clock, blanked; either tree's root printed as <ROOT>.
normalize_text() {
    sed -E -e "s#$base_tree#<ROOT>#g" -e "s#$here#<ROOT>#g" \
        -e 's/^time per step: .*/time per step: <timing>/' \
        -e 's/-?[0-9][0-9.e+-]* ms\b/<t> ms/g' \
        -e 's/[0-9][0-9.e+-]* tok\/s/<t> tok\/s/g' \
        -e 's/MFU [0-9.e+-]+%/MFU <t>%/g' \
        -e 's/[0-9][0-9.e+-]* GFLOP\/s/<t> GFLOP\/s/g' \
        -e 's/measured idle share [0-9.]+%/measured idle share <t>%/g'
}
# A CSV: the columns of times blanked (*_ms: chapter 04's and 05's timelines; tokens_per_s,
# step_ms, mfu: chapter 08's metrics.csv).
normalize_csv() {
    awk -F, -v OFS=, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /_ms$/ || $i == "tokens_per_s" || $i == "mfu") blank[i] = 1 }
                      NR > 1 { for (i in blank) $i = "<t>" } { print }' "$1"
}
# normalize RAW_DIR OUT_DIR: a run's kept outputs, with what depends on the clock blanked.
normalize() {
    local raw=$1 out=$2
    rm -rf "$out"; mkdir -p "$out"
    cp "$raw/status" "$raw/links" "$out/"
    normalize_text <"$raw/stdout" >"$out/stdout"
    normalize_text <"$raw/stderr" >"$out/stderr"
    # (an output directory's .lock: removed at exit, unless mpirun ends a failed run's rank 0 first)
    (cd "$raw/files" && find . -type f ! -name .lock | sort) | while read -r f; do
        mkdir -p "$out/files/$(dirname "$f")"
        case "$f" in
            *.csv) normalize_csv "$raw/files/$f" >"$out/files/$f";;
            *.txt|*.json) normalize_text <"$raw/files/$f" >"$out/files/$f";;
            *) cp "$raw/files/$f" "$out/files/$f";;
        esac
    done
}

# run_one TREE COMMAND RESULT_DIR: the command in TREE's root; its status, streams and files kept.
run_one() {
    local tree=$1 cmd=$2 res=$3
    rm -rf "$scratch" "$res"; mkdir -p "$scratch" "$res"
    (cd "$tree" && MPI="$MPI" BIN="$tree/build/cpu" OUT="$scratch" bash -c "export MPI BIN OUT; $cmd" \
        </dev/null >"$res/stdout" 2>"$res/stderr")
    echo $? >"$res/status"
    cp -r "$scratch" "$res/files"
    (cd "$scratch" && find . -type l | sort) >"$res/links"
}

n=0; differ=0
while IFS= read -r cmd; do
    case "$cmd" in ''|'#'*) continue;; esac
    n=$((n + 1))
    key=$(printf '%s' "$cmd" | md5sum | cut -c1-16)
    base_res=$dir/raw/${base_sha:0:12}/$key new_res=$dir/raw/new/$key
    if [ ! -f "$base_res/status" ]; then run_one "$base_tree" "$cmd" "$base_res"; fi
    run_one "$here" "$cmd" "$new_res"
    short=$(printf '%s' "$cmd" | sed -e 's/\$MPI //g' -e 's/\$BIN\///g' | cut -c1-110)
    normalize "$base_res" "$dir/cmp/base"; normalize "$new_res" "$dir/cmp/new"
    if (cd "$dir/cmp" && diff -r base new) >"$dir/diff.txt" 2>&1; then
        printf 'same    %2d  %s\n' "$n" "$short"
    else
        differ=$((differ + 1))
        printf 'DIFFERS %2d  %s\n' "$n" "$short"
        head -40 "$dir/diff.txt" | sed 's/^/        | /'
    fi
done <<<"$commands"
rm -rf "$scratch" "$dir/cmp"
echo "compare_outputs: $n commands, $differ differ from $base_sha (raw outputs in $dir/raw)"
[ $differ -eq 0 ]
