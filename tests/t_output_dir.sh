#!/usr/bin/env bash
# t_output_dir.sh: output directories that cannot be used are refused as bad input, and long
# messages arrive whole. Through tests/test_output_dir (see its header), on 2 ranks:
#   cli_require_output_dir("--out", PATH) for an empty path, /proc/x, a regular file, a file as
#   a parent, a directory in which no file can be created (/proc), a name too long for the
#   filesystem, a path over 400 bytes, a path with a newline: each must end with exit status 2
#   within 30 s, exactly one line on stderr naming the reason, nothing on stdout, and nothing
#   created (the scratch directory is unchanged);
#   a 3000-byte message refused by rank 1 through comm_require_all reaches rank 0's line whole.
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
bin=$root/$backend/tests/test_output_dir
[ -x "$bin" ] || { echo "no $bin: build first (make BACKEND=$backend)"; exit 1; }
n=0; bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
scratch=$tmp/scratch; mkdir -p "$scratch"
echo x >"$scratch/a_file"
long=$scratch/$(printf 'd%.0s' $(seq 420))
toolong_name=$scratch/new/$(printf 'n%.0s' $(seq 300))

# refuse 'description' PATH 'expected text'
refuse() {
    local what=$1 path=$2 want=$3 before after rc lines
    before=$(cd "$scratch" && find . | sort)
    timeout 30 $mpirun_base -np 2 "$bin" --require-dir "$path" </dev/null >"$tmp/out" 2>"$tmp/err"
    rc=$?
    after=$(cd "$scratch" && find . | sort)
    lines=$(grep -c . "$tmp/err")
    n=$((n+1))
    if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || [ -s "$tmp/out" ] || ! grep -qF -- "$want" "$tmp/err" ||
       [ "$before" != "$after" ]; then
        echo "FAIL $what: exit $rc, $lines stderr line(s); want exit 2 and one line with: $want"
        [ "$before" != "$after" ] && echo "  and it created: $(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
        sed 's/^/  | /' "$tmp/err" "$tmp/out" | head -5
        bad=$((bad+1))
    else
        echo "ok   $what: $(cat "$tmp/err")"
    fi
}

refuse "an empty path" "" "--out '' is not valid: the path is empty"
refuse "under /proc" /proc/x "--out '/proc/x' is not valid: cannot create that directory"
refuse "a regular file" "$scratch/a_file" "is not valid: it exists and is not a directory"
refuse "a file as a parent" "$scratch/a_file/sub" "cannot create that directory (Not a directory)"
refuse "no file can be created there" /proc "--out '/proc' is not valid: cannot write in that directory"
refuse "a 300-byte name, parents not left behind" "$toolong_name" "cannot create that directory (File name too long)"
refuse "a path over 400 bytes" "$long" "bytes, shown shortened) is not valid: the path is $(printf %s "$long" | wc -c) bytes long: at most 400"
refuse "a newline in the path" "$scratch/a
b" "is not valid: the path holds a control character"

# a long message, refused by rank 1, printed whole by rank 0
timeout 30 $mpirun_base -np 2 "$bin" --long-message 3000 </dev/null >"$tmp/out" 2>"$tmp/err"
rc=$?; n=$((n+1))
len=$(head -1 "$tmp/err" | wc -c)
if [ $rc -ne 2 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ] || [ "$len" -ne 3008 ] ||
   ! grep -q '^error: BEGIN.*END$' "$tmp/err"; then
    echo "FAIL a 3000-byte message from rank 1: exit $rc, line of $len bytes (want 3008: 'error: ' + 3000 + newline)"
    bad=$((bad+1))
else
    echo "ok   a 3000-byte message from rank 1 arrives whole"
fi

# a 6,000-byte --data path (an input: no length rule): the line shows the path's ends and keeps
# the reason at its end (issue: it was cut at 1,038 bytes inside the path)
deep=/tmp/$(printf 'a%.0s' $(seq 200)); for i in $(seq 29); do deep=$deep/$(printf 'b%.0s' $(seq 200)); done; deep=$deep/x.txt
timeout 30 $mpirun_base -np 1 "$root/$backend/08" --data "$deep" --steps 1 </dev/null >"$tmp/out" 2>"$tmp/err"
rc=$?; n=$((n+1))
if [ $rc -ne 2 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ] ||
   ! grep -q "(a path of ${#deep} bytes, shown shortened): cannot open: File name too long$" "$tmp/err"; then
    echo "FAIL a ${#deep}-byte --data path: exit $rc, want one line ending with its reason"; sed 's/^/  | /' "$tmp/err" | cut -c1-300
    bad=$((bad+1))
else
    echo "ok   a ${#deep}-byte --data path: one line of $(head -1 "$tmp/err" | wc -c) bytes, ending with the reason"
fi

echo "$((n-bad)) of $n unusable output directories and long messages refused with one whole line and exit 2"
[ $bad -eq 0 ]
