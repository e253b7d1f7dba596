#!/usr/bin/env bash
# t_links_concurrency.sh: what a run does with what it finds where it writes, and with another run
# writing at the same time. Chapter 08 (the trainer: --out, --ckpt-dir, --dump, --export) on a tiny
# model, 1 rank unless said; chapter 01 for a chapter's own CSV.
#   a. symbolic links where a run writes: a link where a checkpoint, its `latest`, an unfinished
#      save, a CSV, a lock, an export or a dump folder is expected is refused before the first step
#      with one line naming it, exit 2, and what it points to is unchanged; a link the user names
#      as the folder itself (--out, --ckpt-dir) or reads (--data) is followed as asked;
#   b. checkpoints: --ckpt-dir naming a step folder (or any folder holding index.json) refused when
#      saving and read when resuming; --ckpt-dir alone refused; an unfinished save's leftovers
#      swept; a run interrupted mid-training resumes from its last complete checkpoint;
#   c. one writer per output: a second run on a live run's --out, --dump, --ckpt-dir (saving) or
#      --export, under any of those flags, is refused with one line naming the other run, and the
#      live run goes on and finishes with its own rows; read-only resumes run side by side; a lock
#      left by a killed run does not block the next;
#   d. interrupted runs: SIGINT or SIGTERM to the rank, during training or after it (sampling),
#      ends with one line and 128 + N (never PARITY FAILED's 1), metrics.csv holding the run's
#      own rows, no lock or temporary left, a dump never left half-written in its place.
# Every case prints "ok" or "FAIL" and a reason; the last line counts them.
set -u
root=${BUILD_ROOT:-build}; backend=${BACKEND:-cpu}
mpirun_base=${MPIRUN_BASE:-$(tools/mpirun_base.sh)}
b08=$root/$backend/08; b01=$root/$backend/01
for b in "$b08" "$b01"; do [ -x "$b" ] || { echo "no $b: build first (make BACKEND=$backend)"; exit 1; }; done
n=0; bad=0
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
cd "$tmp" || exit 1
repo=$OLDPWD
tiny=(--dim 32 --n-layers 1 --n-heads 2 --n-kv-heads 1 --seq-len 16 --batch 2 --eval-every 0
      --data "$repo/08_full_trainer/data/tinyshakespeare.txt")
# one rank, started without mpirun (a singleton: the same checks, a second less each)
t08() { timeout 60 env OPENBLAS_NUM_THREADS=1 "$repo/$b08" "${tiny[@]}" "$@" </dev/null; }
[ -f "$repo/08_full_trainer/data/tinyshakespeare.txt" ] || { echo "no 08_full_trainer/data/tinyshakespeare.txt"; exit 1; }

# fingerprint PATH...: names, kinds, link targets, sizes and contents, unchanged iff equal
fingerprint() {
    local p
    for p in "$@"; do
        [ -e "$p" ] || [ -L "$p" ] || { echo "$p absent"; continue; }
        find "$p" -printf '%p %y %s %l\n' | sort
        find "$p" -type f -exec md5sum {} + 2>/dev/null | sort
    done
}
result() {   # result NAME OK REASON
    n=$((n+1))
    if [ "$2" = 1 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; bad=$((bad+1)); fi
}
# refused NAME 'text' 'victims' CMD...: exit 2, one stderr line holding text, the victims unchanged
refused() {
    local name=$1 text=$2 victims=$3; shift 3
    local before after rc lines
    before=$(fingerprint $victims)
    "$@" >out.txt 2>err.txt; rc=$?
    after=$(fingerprint $victims)
    lines=$(grep -c . err.txt)
    if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$text" err.txt; then
        result "$name" 0 "exit $rc, $lines stderr line(s); want exit 2 and one line with: $text
$(sed 's/^/  | /' err.txt | head -5)"
    elif [ "$before" != "$after" ]; then
        result "$name" 0 "refused, but changed: $(diff <(echo "$before") <(echo "$after") | head -5 | tr '\n' ' ')"
    else
        result "$name: $(cut -c1-150 err.txt)" 1
    fi
}
# runs NAME 'victims' CMD...: exit 0, the victims unchanged
runs() {
    local name=$1 victims=$2; shift 2
    local before after rc
    before=$(fingerprint $victims)
    "$@" >out.txt 2>err.txt; rc=$?
    after=$(fingerprint $victims)
    if [ $rc -ne 0 ]; then result "$name" 0 "exit $rc: $(head -3 err.txt | tr '\n' ' ')"
    elif [ "$before" != "$after" ]; then
        result "$name" 0 "changed: $(diff <(echo "$before") <(echo "$after") | head -5 | tr '\n' ' ')"
    else result "$name" 1; fi
}
# wait_for FILE [SECONDS]: until FILE exists (a live run's lock, its first rows)
wait_for() {
    local i
    for ((i = 0; i < ${2:-300}; i++)); do [ -e "$1" ] && return 0; sleep 0.1; done
    return 1
}
# a long run in the background on 1 rank, mpirun's pid in $live (stop_live ends it; the trap, if
# the script ends first). Not under timeout(1): it signals mpirun twice (the process and its
# group), and Open MPI takes a second signal as "abort now", leaving its ranks no time to finish.
start_live() {
    $mpirun_base -np 1 "$repo/$b08" "${tiny[@]}" --steps 1000000 "$@" </dev/null >live.txt 2>&1 &
    live=$!; pids+=("$live")
}
# stop_live MARKER: ends it, and waits for its rank too (mpirun may exit before its ranks have)
stop_live() {
    local i
    kill -TERM "$live" 2>/dev/null; wait "$live" 2>/dev/null
    for ((i = 0; i < 100; i++)); do pgrep -f -- "$1" >/dev/null || return 0; sleep 0.1; done
}

# an archive: a checkpoint of step 2 of a 4-step run (a resume must keep --steps), kept outside,
# the target of the links below
t08 --steps 4 --ckpt-dir archive --ckpt-every 2 >/dev/null 2>&1 || { echo "the archive run failed"; exit 1; }
step=step_00000002; rm -r archive/step_00000004; sed -i 's/step_00000004/step_00000002/' archive/latest
[ "$(cat archive/latest)" = $step ] && [ -f archive/$step/index.json ] || { echo "the archive is not as expected"; exit 1; }

# ---- a. links where a run writes
mkdir ck1; ln -s "$PWD/archive/$step" ck1/step_00000006
refused "a. a link as a step folder the run will write (issue: the archive was deleted)" "step_00000006 is a symbolic link" \
    "archive ck1" t08 --steps 6 --ckpt-dir ck1 --ckpt-every 3
mkdir ck2; ln -s "$PWD/archive/$step" ck2/step_00000001.tmp.99999
refused "a. a link as an unfinished save (issue: swept through the link)" "step_00000001.tmp.99999 is a symbolic link" \
    "archive ck2" t08 --steps 3 --ckpt-dir ck2 --ckpt-every 3
mkdir ck3; ln -s "$PWD/archive/latest" ck3/latest
refused "a. a link as latest" "latest is a symbolic link" "archive ck3" t08 --steps 3 --ckpt-dir ck3 --ckpt-every 3
mkdir ck4; ln -s "$PWD/archive/latest" ck4/latest.tmp.99999.0badf00d
refused "a. a link as an unfinished latest" "latest.tmp.99999.0badf00d is a symbolic link" "archive ck4" \
    t08 --steps 3 --ckpt-dir ck4 --ckpt-every 3
mkdir ck5; ln -s "$PWD/archive/$step" "ck5/$step"; cp archive/latest ck5/latest
refused "a. a link as the step folder a resume reads" "$step is a symbolic link" "archive ck5" \
    t08 --steps 4 --ckpt-dir ck5 --resume
ln -s "$PWD/archive/$step" ck5/step_00000099.tmp.1.2; rm "ck5/$step"
refused "a. a dangling-free link among the leftovers, with saves" "step_00000099.tmp.1.2 is a symbolic link" "archive ck5" \
    t08 --steps 3 --ckpt-dir ck5 --ckpt-every 3
mkdir real_ck; ln -s real_ck ck_link
runs "a. --ckpt-dir itself a link: followed, as the user named it" "archive" t08 --steps 3 --ckpt-dir ck_link --ckpt-every 3
result "a. ... the checkpoint is in the link's target" "$([ -f real_ck/latest ] && [ -L ck_link ] && echo 1)" \
    "real_ck holds: $(ls -A real_ck | tr '\n' ' ')"
mkdir victim; echo "someone else's rows" >victim/mine.csv
mkdir out1; ln -s ../victim/mine.csv out1/metrics.csv
refused "a. --out's metrics.csv a link" "metrics.csv is a symbolic link" "victim out1" t08 --steps 2 --out out1
mkdir out2; ln -s ../victim/mine.csv out2/loss.csv
refused "a. a chapter's CSV a link (01's loss.csv)" "loss.csv is a symbolic link" "victim out2" \
    timeout 60 $mpirun_base -np 2 "$repo/$b01" --steps 2 --out out2
mkdir out3; ln -s ../victim/mine.csv out3/.lock
refused "a. --out's lock file a link" ".lock" "victim out3" t08 --steps 2 --out out3
mkdir real_out; ln -s real_out out_link
runs "a. --out itself a link: followed" "victim" t08 --steps 2 --out out_link
result "a. ... metrics.csv in the link's target" "$([ -f real_out/metrics.csv ] && [ -L out_link ] && echo 1)" \
    "real_out holds: $(ls -A real_out | tr '\n' ' ')"
ln -s victim/mine.csv e1.safetensors
refused "a. --export a link" "is a symbolic link" "victim e1.safetensors" t08 --steps 2 --out o_e1 --export e1.safetensors
ln -s victim/none.safetensors e2.safetensors
refused "a. --export a dangling link" "is a symbolic link" "victim e2.safetensors" t08 --steps 2 --out o_e2 --export e2.safetensors
ln -s victim/mine.csv .e3.safetensors.lock
refused "a. --export's lock file a link" ".e3.safetensors.lock" "victim" t08 --steps 2 --out o_e3 --export e3.safetensors
result "a. ... nothing exported" "$([ ! -e e3.safetensors ] && echo 1)" "e3.safetensors exists"
mkdir real_dump; ln -s real_dump dump_link
refused "a. --dump a link (the dump replaces its folder whole)" "dump_link is a symbolic link" "real_dump dump_link" \
    t08 --steps 2 --out o_d1 --dump dump_link
t08 --steps 2 --out o_d2 --dump d2 >/dev/null 2>&1
ln -s ../victim/mine.csv d2/losses.txt.old
refused "a. a link inside an old dump: a file a dump does not write" "losses.txt.old" "victim d2" t08 --steps 2 --out o_d2 --dump d2
rm d2/losses.txt.old; rm d2/losses.txt; ln -s ../victim/mine.csv d2/losses.txt
runs "a. an old dump holding a link where its file was: replaced whole, the target kept" "victim" \
    t08 --steps 2 --out o_d2 --dump d2
result "a. ... the new dump in place, no link in it" "$([ -f d2/losses.txt ] && [ ! -L d2/losses.txt ] && echo 1)" \
    "d2: $(ls -lA d2 | tr '\n' ' ')"
ln -s "$repo/08_full_trainer/data/tinyshakespeare.txt" text_link
runs "a. --data a link: read through it" "victim" t08 --steps 2 --out o_data --data text_link

# ---- b. checkpoints
refused "b. --ckpt-dir naming a step folder, saving (issue: the resume loaded step 3 again)" "checkpoint's own folder" \
    "archive" t08 --steps 3 --ckpt-dir "archive/$step" --ckpt-every 3
cp -r "archive/$step" renamed_step
refused "b. --ckpt-dir a folder holding index.json, saving" "it holds index.json" "renamed_step" \
    t08 --steps 3 --ckpt-dir renamed_step --ckpt-every 3
runs "b. --ckpt-dir naming a step folder, resuming without saves: read" "archive" \
    t08 --steps 4 --out o_b3 --ckpt-dir "archive/$step" --resume
refused "b. --ckpt-dir alone" "alone does nothing" "" t08 --steps 2 --ckpt-dir ck_alone
result "b. ... nothing created" "$([ ! -e ck_alone ] && echo 1)" "ck_alone was created"
cp -r archive ck6; cp -r "archive/$step" ck6/step_00000004.tmp.99999.deadbeef   # a save cut short:
rm ck6/step_00000004.tmp.99999.deadbeef/index.json                                 # no index yet
echo "step_00000004" >ck6/latest.tmp.99999.deadbeef
runs "b. an unfinished save's leftovers beside a good checkpoint, resuming and saving" "archive" \
    t08 --steps 4 --out o_b6 --ckpt-dir ck6 --ckpt-every 2 --resume
result "b. ... the leftovers swept, step 4 saved" \
    "$([ ! -e ck6/step_00000004.tmp.99999.deadbeef ] && [ ! -e ck6/latest.tmp.99999.deadbeef ] && [ "$(cat ck6/latest)" = step_00000004 ] && echo 1)" \
    "ck6: $(ls -A ck6 | tr '\n' ' ') latest=$(cat ck6/latest)"

# ---- c. one writer per output (a live run holds the lock; the second run comes while it trains)
start_live --out live_out
wait_for live_out/.lock; sleep 0.3
refused "c. --dump on a live run's --out (issue: the commit swapped the live folder away)" "another run is writing there" \
    "" t08 --steps 2 --out o_c1 --dump live_out
refused "c. --out on a live run's --out" "another run is writing there" "" t08 --steps 2 --out live_out
refused "c. --ckpt-dir with saves on a live run's --out" "another run is writing there" "" \
    t08 --steps 2 --out o_c3 --ckpt-dir live_out --ckpt-every 2
refused "c. 01's --out on 08's live --out" "another run is writing there" "" \
    timeout 60 $mpirun_base -np 2 "$repo/$b01" --steps 2 --out live_out
stop_live "--out live_out"
rows=$(grep -c '^[0-9]' live_out/metrics.csv 2>/dev/null)
result "c. ... the live run kept its own rows (${rows:-0}), no lock or temporary left" \
    "$([ "${rows:-0}" -ge 1 ] && [ -z "$(ls -A live_out | grep -v '^metrics.csv$')" ] && echo 1)" \
    "live_out: $(ls -A live_out | tr '\n' ' ')"

start_live --out o_c5 --export live.safetensors
wait_for .live.safetensors.lock
refused "c. two runs exporting to one file (issue: the other run's weights were left)" "another run is writing there" \
    "" t08 --steps 2 --out o_c6 --export live.safetensors
stop_live "--out o_c5"
runs "c. ... the export free again once the live run ended" "" t08 --steps 2 --out o_c6 --export live.safetensors

start_live --out o_c7 --dump live_dump
wait_for live_dump/.lock
refused "c. --dump on a live run's --dump" "another run is writing there" "" t08 --steps 2 --out o_c8 --dump live_dump
refused "c. --out on a live run's --dump" "another run is writing there" "" t08 --steps 2 --out live_dump
stop_live "--out o_c7"

start_live --out o_c9 --ckpt-dir live_ck --ckpt-every 1000
wait_for live_ck/.lock
refused "c. --ckpt-dir with saves on a live run's --ckpt-dir" "another run is writing there" "" \
    t08 --steps 2 --out o_c10 --ckpt-dir live_ck --ckpt-every 2
refused "c. --out on a live run's --ckpt-dir" "another run is writing there" "" t08 --steps 2 --out live_ck
stop_live "--out o_c9"

cp -r archive ck7
t08 --steps 4 --out o_r1 --ckpt-dir ck7 --resume >r1.txt 2>&1 & r1=$!; pids+=("$r1")
t08 --steps 4 --out o_r2 --ckpt-dir ck7 --resume >r2.txt 2>&1 & r2=$!; pids+=("$r2")
wait "$r1"; rc1=$?; wait "$r2"; rc2=$?
result "c. two read-only resumes of one folder at once (issue: one refused)" "$([ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && echo 1)" \
    "exits $rc1 and $rc2: $(cat r1.txt r2.txt | grep -i error | head -2 | tr '\n' ' ')"
result "c. ... the folder as it was (no lock left)" "$([ "$(cd ck7 && fingerprint .)" = "$(cd archive && fingerprint .)" ] && echo 1)" \
    "ck7: $(ls -A ck7 | tr '\n' ' ')"

$mpirun_base -np 1 "$repo/$b08" "${tiny[@]}" --steps 1000000 --out o_kill </dev/null >/dev/null 2>&1 & k=$!; pids+=("$k")
wait_for o_kill/.lock; sleep 0.5
pkill -KILL -f -- "^[^ ]*/08 .*--out o_kill" 2>/dev/null; wait "$k" 2>/dev/null
runs "c. a lock left by a killed run (SIGKILL) does not block the next" "" t08 --steps 2 --out o_kill
result "c. ... and the next run's rows replaced the killed run's" "$([ "$(grep -c '^[0-9]' o_kill/metrics.csv)" = 2 ] && echo 1)" \
    "o_kill/metrics.csv: $(wc -l <o_kill/metrics.csv) lines"

# ---- d. interrupted runs (the rank itself, without mpirun: 128 + N, as tools/exit_status.sh
# documents; t_rank_failures.sh signals mpirun, make and the whole group)
# signal_run NAME SIGNAL WANT_RC WAIT_FOR_TEXT ARGS...: start the rank, signal it when its output
# shows the text, check the status and the one line
signal_run() {
    local name=$1 sig=$2 want=$3 text=$4; shift 4
    local pid rc i
    # emptied here, before the fork: the child's own redirection would truncate them only after
    # the loop below may have read the previous run's "step N" and signalled a process that has
    # no handler yet (the default action: exit 129 with no line; seen once in make test)
    : >sig_out.txt; : >sig_err.txt
    set -m
    stdbuf -oL "$repo/$b08" "${tiny[@]}" "$@" </dev/null >sig_out.txt 2>sig_err.txt & pid=$!
    set +m; pids+=("$pid")
    for ((i = 0; i < 300; i++)); do grep -q -- "$text" sig_out.txt 2>/dev/null && break; sleep 0.1; done
    kill -"$sig" "$pid"; wait "$pid" 2>/dev/null; rc=$?
    local lines; lines=$(grep -c . sig_err.txt)
    result "$name: exit $rc, $(head -1 sig_err.txt | cut -c1-100)" \
        "$([ $rc -eq "$want" ] && [ "$lines" -eq 1 ] && grep -qi "$sig\|interrupt\|stopped" sig_err.txt && echo 1)" \
        "want exit $want and one line naming $sig; $lines line(s): $(head -3 sig_err.txt | tr '\n' ' ')"
}
signal_run "d. SIGINT mid-training" INT 130 "^step   *3 " --steps 1000000 --out o_s1
last=$(grep -o '^step *[0-9]*' sig_out.txt | tail -1 | grep -o '[0-9]*$')
rows=$(grep -c '^[0-9]' o_s1/metrics.csv 2>/dev/null)
result "d. ... metrics.csv holds the run's own rows up to its last step ($rows, printed $last)" \
    "$([ -n "$rows" ] && [ -n "$last" ] && [ "$rows" -ge $((last - 1)) ] && [ "$rows" -le "$last" ] && echo 1)" \
    "rows ${rows:-none}, last printed step ${last:-none}"
result "d. ... no lock or temporary left in --out" "$([ "$(ls -A o_s1)" = metrics.csv ] && echo 1)" "o_s1: $(ls -A o_s1 | tr '\n' ' ')"
# (the signal once step 5 is printed: a step's line comes before its save, so after "step 4" the
# save of step 4 may still be under way, and the kill then leaves step 3 the last one; seen once)
signal_run "d. SIGTERM mid-training, saving every step" TERM 143 "^step   *5 " --steps 3000 --out o_s2 --ckpt-dir ck_s2 --ckpt-every 1
saved=$(sed 's/step_0*//' ck_s2/latest 2>/dev/null)
runs "d. ... the interrupted run resumes from its last complete checkpoint (step ${saved:-none})" "" \
    t08 --steps 3000 --out o_s2b --ckpt-dir ck_s2 --resume
result "d. ... which is the run's own, past step 4" "$([ "${saved:-0}" -ge 4 ] && grep -q "at step $((saved + 1))" out.txt && echo 1)" \
    "latest: ${saved:-none}; the resume said: $(grep -i resum out.txt | head -1)"
signal_run "d. SIGINT after training, while sampling (issue: exit 1, no line)" INT 130 "^sample (" \
    --steps 2 --out o_s3 --sample 1000000
t08 --steps 2 --out o_s4 --dump d_s4 >/dev/null 2>&1; before=$(fingerprint d_s4)
signal_run "d. SIGTERM while a --dump run trains" TERM 143 "^step   *2 " --steps 1000000 --out o_s4 --dump d_s4
result "d. ... the previous dump untouched, nothing half-written beside it" \
    "$([ "$before" = "$(fingerprint d_s4)" ] && [ -z "$(ls -d d_s4.tmp* 2>/dev/null)" ] && echo 1)" \
    "$(ls -d d_s4* | tr '\n' ' ')"
signal_run "d. SIGTERM while a first --dump run trains" TERM 143 "^step   *2 " --steps 1000000 --out o_s4 --dump d_s4b
result "d. ... no dump folder and nothing half-written left" "$([ -z "$(ls -d d_s4b* 2>/dev/null)" ] && echo 1)" \
    "$(ls -d d_s4b* 2>/dev/null | tr '\n' ' ')"
signal_run "d. SIGHUP mid-training (a closed terminal)" HUP 129 "^step   *2 " --steps 1000000 --out o_s5
signal_run "d. SIGQUIT mid-training (Ctrl-\\)" QUIT 131 "^step   *2 " --steps 1000000 --out o_s6
result "d. ... no rank process left" "$(pgrep -f -- "--out o_s[1-6]" >/dev/null || echo 1)" "$(pgrep -af -- '--out o_s' | head -2)"

echo "$((n - bad)) of $n link, concurrency and interruption cases meet the contract"
[ $bad -eq 0 ]
