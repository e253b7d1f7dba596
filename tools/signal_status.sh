#!/usr/bin/env bash
# signal_status.sh COMMAND...: runs COMMAND (an mpirun) and, when this script is interrupted
# (SIGINT: Ctrl-C; SIGTERM: a scheduler ending the job; SIGHUP: the terminal closed; SIGQUIT:
# Ctrl-\), lets COMMAND end its ranks and exits with the conventional status, 128 + the signal
# (130, 143, 129, 131). Open MPI 4.1's mpirun itself exits 1 when interrupted, the status of
# PARITY FAILED, and ignores SIGQUIT; `make run-NN` runs its mpirun through this script so that an
# interrupted run says what it was (README, "Exit statuses").
# WATCH_PID (make passes its own pid): when that process ends (make killed alone, `kill -TERM`
# of make's pid), the run is ended too, as if this script had received SIGTERM; a run whose make
# is gone would otherwise go on training unseen.
sig=0; forwarded=""
trap 'sig=2' INT
trap 'sig=15' TERM
trap 'sig=1' HUP
trap 'sig=3' QUIT
exec 3<&0                       # COMMAND keeps this script's standard input (a background
"$@" <&3 3<&- & pid=$!          # command would otherwise get /dev/null)
exec 3<&-
watched=${WATCH_PID:-}
# alive PID: the process exists and is not a zombie (a killed make stays a zombie until its own
# parent reaps it, and kill -0 still finds a zombie)
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    [ -r "/proc/$1/stat" ] || return 0
    local st; st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ "$st" != Z ] && [ "$st" != X ]
}
if [ -n "$watched" ]; then      # a watcher: TERM to this script once the watched process is gone
    ( while alive "$watched" && kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -TERM $$ 2>/dev/null ) </dev/null >/dev/null 2>&1 &
    watcher=$!
fi
while :; do
    wait "$pid"; st=$?
    kill -0 "$pid" 2>/dev/null || break   # wait returned early: a trapped signal arrived
    if [ "$sig" -ne 0 ] && [ -z "$forwarded" ]; then
        # Ctrl-C signals the whole foreground process group, mpirun too, and a second signal
        # would make mpirun kill its ranks at once, before they explain the end: pass the signal
        # on only if mpirun has not begun to end within 2 s (it was sent to this script alone).
        # mpirun acts on SIGTERM (it ignores SIGQUIT), so that is what it gets.
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
        forwarded=yes
    fi
done
[ -n "${watcher:-}" ] && kill "$watcher" 2>/dev/null
[ "$sig" -ne 0 ] && exit $((128 + sig))
exit "$st"
