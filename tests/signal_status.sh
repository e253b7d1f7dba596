#!/usr/bin/env bash
# signal_status.sh COMMAND...: runs COMMAND (an mpirun) and, when this script is interrupted
# (SIGINT: Ctrl-C; SIGTERM: a scheduler ending the job), lets COMMAND end its ranks and exits with
# the conventional status, 130 or 143. Open MPI 4.1's mpirun itself exits 1 when interrupted, the
# status of PARITY FAILED; `make run-NN` runs its mpirun through this script so that an
# interrupted run says what it was (README, "Exit statuses").
sig=0; forwarded=""
trap 'sig=2' INT
trap 'sig=15' TERM
exec 3<&0                       # COMMAND keeps this script's standard input (a background
"$@" <&3 3<&- & pid=$!          # command would otherwise get /dev/null)
exec 3<&-
while :; do
    wait "$pid"; st=$?
    kill -0 "$pid" 2>/dev/null || break   # wait returned early: a trapped signal arrived
    if [ "$sig" -ne 0 ] && [ -z "$forwarded" ]; then
        # Ctrl-C signals the whole foreground process group, mpirun too, and a second signal
        # would make mpirun kill its ranks at once, before they explain the end: pass the signal
        # on only if mpirun has not begun to end within 2 s (it was sent to this script alone).
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
        forwarded=yes
    fi
done
[ "$sig" -ne 0 ] && exit $((128 + sig))
exit "$st"
