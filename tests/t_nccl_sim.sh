#!/usr/bin/env bash
# t_nccl_sim.sh: the NCCL-semantics emulation (COMM=nccl-sim, common/backend/comm_nccl_sim.c)
# catches what MPI forgives.
#   1. chapter 05's pipeline with every message on the one pp group (--p2p shared, the design
#      before links): correct under MPI (PARITY OK), deadlocked under NCCL's rules, where the
#      watchdog ends it with status 3 and one line naming the receive it waited in;
#   1b. the same pipeline (GPipe) over links left to connect at their first message (--p2p lazy):
#      correct under MPI, deadlocked under NCCL's lazy connection (rule 5 of the emulation), the
#      watchdog's line naming the link and the connection it waited in;
#   2. the same pipeline over links (the default: connected when created) passes under the
#      emulation, 1F1B, interleaved and GPipe;
#   3. COMM's refusals: an unknown value, and COMM=nccl on the CPU build: one line, status 2;
#   4. COMM=mpi's staging through host memory (the CUDA build's path, so that ranks can share a
#      GPU), forced on the CPU build with COMM_STAGE=1: the collectives' test and an interleaved pipeline.
# make test also runs every chapter's checks under COMM=nccl-sim (run_tests.sh).
set -u
cd "$(dirname "$0")/.."
root=${BUILD_ROOT:-build}
bin=$root/cpu/05
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
n=0; bad=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $1"; sed 's/^/  | /' "$tmp/out.txt" | tail -8; bad=$((bad+1)); }
# run NAME COMM STATUS ARGS...: 2 ranks of chapter 05; the exit status must be STATUS
run() {
    local what=$1 comm=$2 want=$3; shift 3
    n=$((n+1))
    COMM=$comm timeout 120 $mpirun_base -np 2 "$bin" --check --steps 2 --out "$tmp/o" "$@" </dev/null >"$tmp/out.txt" 2>&1
    local rc=$?
    [ $rc -eq "$want" ] || { fail "$what: exit $rc, want $want"; return 1; }
}
[ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }

# 1. the old design: one group for all of the pipeline's messages
run "--p2p shared under MPI" mpi 0 --schedule 1f1b --microbatches 4 --p2p shared &&
    { n=$((n+1)); grep -q '^PARITY OK' "$tmp/out.txt" || fail "--p2p shared under MPI: no PARITY OK"; }
t0=$(date +%s)
if run "--p2p shared under COMM=nccl-sim (deadlock)" nccl-sim 3 --schedule 1f1b --microbatches 4 --p2p shared --timeout 5; then
    n=$((n+1))
    errs=$(grep -c '^error:' "$tmp/out.txt")
    grep -q '^error: no progress for 5 s in recv on group pp' "$tmp/out.txt" && [ "$errs" -eq 1 ] ||
        fail "the deadlock's watchdog line: want one 'error: no progress for 5 s in recv on group pp ...', got $errs error lines"
fi
secs=$(( $(date +%s) - t0 ))

# 1b. links left to connect at their first message, as NCCL does by itself (--p2p lazy): under MPI
#     the pipeline passes; under the emulation's lazy connection (rule 5) GPipe's receive, posted
#     one action early, blocks the host of stage 0 in the connection of link 1>0 before it sends
#     its last forward's output, which stage 1 waits for: the watchdog ends it (status 3), naming
#     the connection
run "--p2p lazy under MPI" mpi 0 --schedule gpipe --microbatches 4 --p2p lazy &&
    { n=$((n+1)); grep -q '^PARITY OK' "$tmp/out.txt" || fail "--p2p lazy under MPI: no PARITY OK"; }
t0=$(date +%s)
if run "--p2p lazy under COMM=nccl-sim (deadlock in the lazy connection)" nccl-sim 3 --schedule gpipe --microbatches 4 --p2p lazy --timeout 5; then
    n=$((n+1))
    errs=$(grep -c '^error:' "$tmp/out.txt")
    grep -q "^error: no progress for 5 s in recv on group pp 1>0 (NCCL's lazy connection: waiting for the link's other rank to make its first send to this rank)" "$tmp/out.txt" &&
        [ "$errs" -eq 1 ] || fail "the lazy connection's watchdog line: want one naming link pp 1>0 and the lazy connection, got $errs error lines"
fi
lazy_secs=$(( $(date +%s) - t0 ))

# 2. the design with links (connected when created)
run "1f1b over links under COMM=nccl-sim" nccl-sim 0 --schedule 1f1b --microbatches 4 --timeout 60
run "interleaved over links under COMM=nccl-sim" nccl-sim 0 --schedule interleaved --microbatches 4 --timeout 60
run "gpipe over links under COMM=nccl-sim" nccl-sim 0 --schedule gpipe --microbatches 4 --timeout 60

# 3. refusals
run "COMM=gloo" gloo 2 && { n=$((n+1)); [ "$(grep -c . "$tmp/out.txt")" -eq 1 ] && grep -q '^error: COMM=gloo is not valid: use COMM=mpi' "$tmp/out.txt" || fail "COMM=gloo: want one line naming the valid values"; }
run "COMM=nccl on the CPU build" nccl 2 && { n=$((n+1)); [ "$(grep -c . "$tmp/out.txt")" -eq 1 ] && grep -q '^error: COMM=nccl needs the CUDA build' "$tmp/out.txt" || fail "COMM=nccl on the CPU build: want one line"; }

# 4. the staged path
n=$((n+1))
COMM_STAGE=1 timeout 120 $mpirun_base -np 4 "$root/cpu/tests/test_comm" </dev/null >"$tmp/out.txt" 2>&1 || fail "test_comm with COMM_STAGE=1"
COMM_STAGE=1 run "a pipeline with COMM_STAGE=1" mpi 0 --schedule interleaved --microbatches 2 &&
    { n=$((n+1)); grep -q '^PARITY OK' "$tmp/out.txt" || fail "COMM_STAGE=1: no PARITY OK"; }

[ $bad -eq 0 ] || { echo "$bad of $n checks failed"; exit 1; }
echo "$n checks ok (under COMM=nccl-sim the shared-group pipeline deadlocks, caught in $secs s, and the lazily connected links too, in $lazy_secs s; over links connected at creation it passes)"
