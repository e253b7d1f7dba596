#!/usr/bin/env bash
# t_bad_input.sh: every chapter's NN_*/bad_inputs.txt. Each case must end all ranks with exit
# status 2 within 60 s (no hang), and print exactly one line (on stderr) containing the
# expected text; stdout must be empty; and it must leave nothing behind: each case runs in an
# empty scratch directory (its default --out is relative to it) that must still be empty.
# @FIX@ in a case stands for a folder of fixtures made below (a text, links to it, a FIFO, a
# directory locked by another "run"); @SP@ for a space inside an argument (--seed @SP@-1: " -1").
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
# Every rank of a refused input ends by itself (comm_exit_usage: a barrier, MPI_Finalize, exit 2),
# yet after a non-zero exit Open MPI waits twice its odls_base_sigkill_timeout (1 s) before it
# signals ranks that are already gone: 0 takes 2 s off each of the ~150 cases. A rank that hangs is
# still caught: rank 0 waits for it in that barrier until the 60 s timeout.
mpirun_base="${MPIRUN_BASE:-$(tools/mpirun_base.sh)} --mca odls_base_sigkill_timeout 0"
n=0; bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bin_dir=$(cd "$root/$backend" && pwd)
# Files a case may name as @FIX@/...: a text to train on (and a hard and a symbolic link to it),
# a FIFO, a plain file, a directory that holds o/metrics.csv, and a directory another "run" holds
# locked (this shell keeps flock on its .lock, as a running trainer's rank 0 does).
fix=$tmp/fix; mkdir -p "$fix/ck" "$fix/o" "$fix/locked"
head -c 60000 08_full_trainer/data/tinyshakespeare.txt >"$fix/text.txt"
ln "$fix/text.txt" "$fix/hard"; ln -s text.txt "$fix/link"; mkfifo "$fix/fifo"; echo x >"$fix/afile"
cp "$fix/text.txt" "$fix/o/metrics.csv"
exec 9>"$fix/locked/.lock"; flock -n 9; echo "pid $$ on t_bad_input" >&9
for f in [0-9][0-9]_*/bad_inputs.txt; do
    nn=$(basename "$(dirname "$f")" | cut -c1-2)
    while IFS='|' read -r np flags want; do
        case "$np" in ''|'#'*) continue;; esac
        np=$(echo $np); want=$(echo "$want" | sed 's/^ *//; s/ *$//')
        flags=${flags//@FIX@/$fix}; want=${want//@FIX@/$fix}
        rm -rf "$tmp/cwd"; mkdir "$tmp/cwd"
        read -ra words <<<"$flags"; words=("${words[@]//@SP@/ }")   # @SP@: a space inside an argument
        (cd "$tmp/cwd" && timeout 60 $mpirun_base -np "$np" "$bin_dir/$nn" "${words[@]}" </dev/null >"$tmp/out" 2>"$tmp/err")
        rc=$?
        left=$(ls -A "$tmp/cwd")
        # mpirun's own libevent may warn "[warn] Epoll MOD(1) on fd N failed ... Bad file descriptor"
        # when, with the sigkill timeout of 0 above, it tears down the socket of a rank that has
        # already exited (seen once in about 200 cases under load): mpirun's line, not the chapter's
        sed -i '/^\[warn\] Epoll [A-Z]*([0-9]*) on fd [0-9]* failed/d' "$tmp/err"
        lines=$(grep -c . "$tmp/err"); n=$((n+1))
        if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || [ -s "$tmp/out" ] || [ -n "$left" ] || ! grep -qF -- "$want" "$tmp/err"; then
            echo "chapter $nn NP=$np '$flags': exit $rc, $lines stderr line(s), left '$left', expected exit 2, nothing left and one line with: $want"
            sed 's/^/  | /' "$tmp/err" "$tmp/out" | head -10
            bad=$((bad+1))
        fi
    done < "$f"
done
echo "$((n-bad)) of $n bad inputs refused with one line and exit 2"
[ $bad -eq 0 ]
