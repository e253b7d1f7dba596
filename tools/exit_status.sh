#!/usr/bin/env bash
# exit_status.sh STATUS [WHAT]: one line saying what a chapter run's exit status means (the
# README's "Exit statuses"; common/backend/guard.h). `make run-NN` prints it when a run fails,
# since make itself then exits with 2 whatever the run's status was.
st=${1:?usage: exit_status.sh STATUS [WHAT]}; what=${2:-the run}
case "$st" in
0)   echo "$what: exit status 0: finished (PARITY OK with --check)" ;;
1)   echo "$what: exit status 1: PARITY FAILED (the parallel run disagrees with the baseline), a runtime error, or a bare mpirun interrupted (SIGINT/SIGTERM: Open MPI's mpirun exits 1; its line says so)" ;;
2)   echo "$what: exit status 2: bad input (a flag's value, an unusable or locked output path, ranks started with different arguments) or an output write that failed (a full disk)" ;;
3)   echo "$what: exit status 3: a rank waited longer than --timeout: another rank stopped, died or is stuck" ;;
4)   echo "$what: exit status 4: the loss or the gradient norm became NaN or infinite (chapter 08); the last good checkpoint is kept" ;;
124) echo "$what: exit status 124: stopped by timeout(1)" ;;
126|127) echo "$what: exit status $st: mpirun could not be run (not executable or not found)" ;;
130) echo "$what: exit status 130: interrupted by SIGINT (Ctrl-C)" ;;
143) echo "$what: exit status 143: ended by SIGTERM (or make, which ran it, was killed)" ;;
129) echo "$what: exit status 129: ended by SIGHUP (the terminal closed)" ;;
131) echo "$what: exit status 131: ended by SIGQUIT (Ctrl-\\)" ;;
132) echo "$what: exit status 132: mpirun could not start the program (or a rank was killed by SIGILL)" ;;
*)   if [ "$st" -gt 128 ] 2>/dev/null; then
         sig=$((st - 128)); name=$(kill -l "$sig" 2>/dev/null)
         echo "$what: exit status $st: a rank was killed by signal $sig (SIG${name:-?}); mpirun ended the others"
     else
         echo "$what: exit status $st: mpirun itself failed (see its messages above)"
     fi ;;
esac
