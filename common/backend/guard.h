/* guard.h: a job whose ranks disagree, stop or die ends with one line and a known exit status,
 * never with a hang.
 *
 * Two guards, both started by comm_init (guard_init, right after MPI_Init):
 *
 *   Argument agreement. Every rank hashes its command line (the program's name and every
 *   argument) and the ranks compare. Chapter code assumes every rank parsed the same flags
 *   (each rank decides a bad value on its own and they all exit together); ranks started with
 *   different arguments, as in `mpirun -np 1 01 --steps 1 : -np 1 01 --bogus`, would otherwise
 *   wait for each other forever. Rank 0 prints one line and every rank exits with status 2.
 *
 *   Watchdog. A background thread on each rank watches what the rank is doing: comm.c tells it
 *   when a collective (or a wait) begins and ends, and the harness may add a heartbeat once a
 *   step (guard_progress). If the rank stays inside one call, or goes without any call or
 *   heartbeat, for longer than the timeout (--timeout SECONDS, default 600), another rank has
 *   stopped, died or is stuck: the watchdog prints one line naming what it waited for and for
 *   how long, and ends the job with MPI_Abort and status 3. Rank 0 fires first; the others wait
 *   a little longer (2 s and more) so that normally only rank 0 speaks, and speak only if rank 0
 *   itself is the one that stopped. Time during which this process was itself stopped
 *   (SIGSTOP, a suspended machine) does not count.
 *
 *   Signals. A rank killed by a signal ends the job through mpirun, which then sends SIGTERM to
 *   the others and exits with 128 + the signal; the first of them to get it names the dead rank
 *   in one line (rank 0's death is reported by rank 1). A rank that crashes (SIGSEGV, SIGBUS,
 *   SIGFPE, SIGILL, SIGABRT) prints its own line first, then the handler that was there before
 *   runs (Open MPI's backtrace, a sanitizer's report). SIGINT, SIGTERM or SIGHUP to mpirun:
 *   mpirun sends SIGTERM to the ranks (for each of them), one rank says the job was interrupted,
 *   and the ranks end with 128 + the signal; mpirun itself (Open MPI 4.1) exits with 1 whatever
 *   the ranks' statuses (SIGQUIT it ignores: `make run-NN` passes that one on). A rank signalled
 *   directly (a terminal's Ctrl-C or Ctrl-\ reaches every process of the group) says which
 *   signal, and ends with 128 + it: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 131 SIGQUIT. Before it
 *   ends, the functions of guard_on_stop run (the files being written renamed into place).
 *   One line in every case: the ranks of a node share a table (pid, state, and a token taken by
 *   the rank that explains), so the report depends on no timing.
 *
 * Exit statuses of a chapter run (the README's "Exit statuses" lists the same):
 *   0      the run finished (PARITY OK with --check)
 *   1      PARITY FAILED: the parallel model disagrees with the baseline
 *   2      bad input: a flag's value, or ranks started with different arguments
 *   3      GUARD_EXIT_STALLED: a rank waited longer than --timeout (a rank stopped or died)
 *   128+N  a rank was killed by signal N: 137 SIGKILL, 139 SIGSEGV, 134 SIGABRT (mpirun's status);
 *          130 SIGINT, 143 SIGTERM for a run without mpirun (mpirun interrupted exits 1)
 */
#pragma once
#include "cdefs.h"

C_BEGIN

#define GUARD_EXIT_STALLED 3
#define GUARD_DEFAULT_TIMEOUT 600.0

/* Called by comm_init right after MPI_Init, on every rank: argument agreement (exit 2 on a
 * mismatch), the environment variable GUARD_TIMEOUT (seconds, 0 = no watchdog) if set, the
 * node's table, the signal handlers (SIGINT, SIGTERM, crashes), and the watchdog thread. The thread stops by itself inside MPI_Finalize. */
void guard_init(int argc, char **argv);

/* The watchdog's timeout in seconds; 0 turns it off. For the --timeout flag. */
void guard_set_timeout(double seconds);
double guard_timeout(void);

/* comm.c: a blocking call begins / ends. `what` ("all_reduce") and `group` ("tp") must stay
 * valid until guard_end (they are the collective's and the group's names). */
void guard_begin(const char *what, const char *group);
void guard_end(void);
/* Inside a call, what exactly it is waiting for, when the backend knows more than the call's name:
 * "NCCL's lazy connection: waiting for rank 1 to make its first recv from this rank", "queued
 * behind the recv this rank issued first on the group". The watchdog's line adds it after the
 * group's name; guard_end forgets it. `note` is copied (at most 160 characters kept). */
void guard_note(const char *note);

/* Work a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) must do before the rank ends, in the
 * signal handler: async-signal-safe calls only (rename, unlink, stat). The harness renames the
 * files it is writing into place (an interrupted run's metrics.csv holds its rows up to its last
 * finished step) and removes its lock files. Each runs once, in the order registered; at most 8. */
void guard_on_stop(void (*fn)(void));

/* A rank about to end the job on its own (an allocation that failed, exit 2) asks whether it is the
 * one to explain the end: 1 for the first to ask among the ranks of this node (and the watchdog's
 * or a signal's report), 0 when another has explained already, so that one line is printed. */
int guard_claim_line(void);

/* A heartbeat outside any call, e.g. guard_progress("step 3") at the top of each step: the
 * rank is alive, and the watchdog's line names the last heartbeat. `what` is copied. */
void guard_progress(const char *what);

C_END
