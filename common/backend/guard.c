/* guard.c: see guard.h. Argument agreement at start, a watchdog thread, and the line rank 0
 * prints when mpirun ends the job because another rank died.
 *
 * The watchdog thread never calls MPI except MPI_Abort, which Open MPI accepts from any thread:
 * it asks mpirun to end every rank of the job (a stopped rank too: mpirun sends SIGCONT, then
 * SIGTERM, then SIGKILL) with the given status.
 */
#include "guard.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"

/* ---- the state the watchdog watches, written by the rank's main thread ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t thread;
static int running;               /* the thread exists (guarded by mu)                     */
static int stopping;              /* guard_stop asked it to end (guarded by mu)            */
static double timeout_s = GUARD_DEFAULT_TIMEOUT;
static double last_event;         /* when the rank last began or ended a call or beat      */
static const char *in_what;       /* inside a call: its name and group; NULL outside       */
static const char *in_group;
static char last_what[96] = "the start";   /* outside a call: what happened last        */
static int my_rank, world_size;

/* Read by the SIGTERM handler, hence atomics of integer type (lock-free, signal-safe). */
static atomic_int armed;          /* between guard_init and MPI_Finalize                   */
static atomic_int aborting;       /* the watchdog fired: this rank is ending the job      */
static atomic_llong tick_ms;      /* the watchdog's last look at the clock                 */
static atomic_llong resumed_ms;   /* when the watchdog last found the process had stopped */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static long long now_ms(void) { return (long long)(now_s() * 1e3); }

/* ---- what comm.c and the harness call ---- */

void guard_set_timeout(double seconds) {
    pthread_mutex_lock(&mu);
    timeout_s = seconds > 0 ? seconds : 0;
    last_event = now_s();   /* a new timeout counts from now */
    pthread_mutex_unlock(&mu);
}

double guard_timeout(void) {
    pthread_mutex_lock(&mu);
    double t = timeout_s;
    pthread_mutex_unlock(&mu);
    return t;
}

void guard_begin(const char *what, const char *group) {
    pthread_mutex_lock(&mu);
    in_what = what;
    in_group = group;
    last_event = now_s();
    pthread_mutex_unlock(&mu);
}

void guard_end(void) {
    pthread_mutex_lock(&mu);
    if (in_what) snprintf(last_what, sizeof last_what, "%s on group %s", in_what, in_group);
    in_what = NULL;
    last_event = now_s();
    pthread_mutex_unlock(&mu);
}

void guard_progress(const char *what) {
    pthread_mutex_lock(&mu);
    snprintf(last_what, sizeof last_what, "%s", what);
    last_event = now_s();
    pthread_mutex_unlock(&mu);
}

/* ---- the watchdog ---- */

/* Rank 0 fires at the timeout; rank r > 0 waits 2 s + 0.5 s per rank more (at most 10 s), time
 * enough for rank 0's MPI_Abort to end it first: one line, unless rank 0 is the one that stopped. */
static double grace_s(void) {
    if (my_rank == 0) return 0.0;
    double g = 2.0 + 0.5 * (my_rank - 1);
    return g < 10.0 ? g : 10.0;
}

static void fire(double waited, const char *what, int inside, double timeout) {
    atomic_store(&aborting, 1);
    char line[400], who[32] = "";
    if (my_rank != 0) snprintf(who, sizeof who, "rank %d: ", my_rank);
    snprintf(line, sizeof line,
             "error: %sno progress for %.0f s %s %s; a rank may have stopped or died (--timeout %g)\n",
             who, waited, inside ? "in" : "since", what, timeout);
    ssize_t rc = write(STDERR_FILENO, line, strlen(line));
    (void)rc;
    MPI_Abort(MPI_COMM_WORLD, GUARD_EXIT_STALLED);
    _exit(GUARD_EXIT_STALLED);   /* MPI_Abort does not return; in case it did */
}

static void *watchdog(void *arg) {
    (void)arg;
    const double poll = 0.1;
    double last_tick = now_s();
    pthread_mutex_lock(&mu);
    while (!stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(poll * 1e9);
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&wake, &mu, &until);
        if (stopping) break;

        double now = now_s();
        /* A gap far longer than the poll means this whole process was stopped (SIGSTOP,
         * a suspended machine): that time is nobody's fault here, so it does not count. */
        if (now - last_tick > 1.0) {
            last_event += now - last_tick - poll;
            atomic_store(&resumed_ms, now_ms());
        }
        last_tick = now;
        atomic_store(&tick_ms, (long long)(now * 1e3));

        double waited = now - last_event;
        if (timeout_s > 0 && waited > timeout_s + grace_s()) {
            char what[160];
            int inside = in_what != NULL;
            if (inside) snprintf(what, sizeof what, "%s on group %s", in_what, in_group);
            else snprintf(what, sizeof what, "%s", last_what);
            double t = timeout_s;
            pthread_mutex_unlock(&mu);
            fire(waited, what, inside, t);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* ---- SIGTERM: mpirun is ending the job ----
 * mpirun ends the remaining ranks with SIGCONT, SIGTERM and then SIGKILL when a rank died or
 * exited without the others, when another rank's watchdog called MPI_Abort, or when the job
 * was interrupted (Ctrl-C). Rank 0 says so in one line, unless it is itself the cause (its
 * watchdog fired) or it had been stopped (the rank that fired has already explained). Only
 * async-signal-safe calls here: write, clock_gettime, sigaction, raise. */
static void on_sigterm(int sig) {
    long long t = now_ms();
    int was_stopped = t - atomic_load(&tick_ms) > 1000 || t - atomic_load(&resumed_ms) < 3000;
    if (atomic_load(&armed) && !atomic_load(&aborting) && my_rank == 0 && !was_stopped) {
        static const char line[] =
            "error: mpirun ended the job: another rank died or exited early (an exit status of "
            "128+N means a rank was killed by signal N), or the job was interrupted\n";
        ssize_t rc = write(STDERR_FILENO, line, sizeof line - 1);
        (void)rc;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

/* ---- start and stop ---- */

static void guard_stop(void) {
    atomic_store(&armed, 0);
    pthread_mutex_lock(&mu);
    int was_running = running;
    stopping = 1;
    running = 0;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
    if (was_running) pthread_join(thread, NULL);
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first thing: the watchdog stops there, on
 * every way out (comm_finalize, comm_exit_usage, a chapter's own MPI_Finalize). */
static int on_finalize(MPI_Comm comm, int keyval, void *value, void *extra) {
    (void)comm; (void)keyval; (void)value; (void)extra;
    guard_stop();
    return MPI_SUCCESS;
}

/* FNV-1a over the program's name (without its directory: `./01` and `/path/01` are the same
 * program) and every argument, each followed by a 0 byte so that "ab" "c" and "a" "bc" differ. */
static uint64_t hash_args(int argc, char **argv) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i] ? argv[i] : "";
        if (i == 0 && strrchr(s, '/')) s = strrchr(s, '/') + 1;
        for (const unsigned char *p = (const unsigned char *)s;; p++) {
            h = (h ^ *p) * 1099511628211ull;
            if (!*p) break;
        }
    }
    return h;
}

void guard_init(int argc, char **argv) {
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);

    /* 1. every rank must have been started with the same command line */
    uint64_t mine = hash_args(argc, argv), rank0 = mine;
    MPI_Bcast(&rank0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int differs = mine != rank0 ? my_rank : world_size, first;
    MPI_Allreduce(&differs, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first < world_size)
        comm_exit_usage("the ranks were started with different arguments (rank %d differs from "
                        "rank 0); every rank must get the same flags", first);

    /* 2. GUARD_TIMEOUT from the environment (mpirun -x GUARD_TIMEOUT=...) */
    const char *env = getenv("GUARD_TIMEOUT");
    if (env) {
        char *end;
        errno = 0;
        double t = strtod(env, &end);
        int ok = !errno && end != env && !*end && t >= 0 && t <= 1e6;
        comm_require_all(ok, "GUARD_TIMEOUT '%s' is not valid: expected seconds from 0 (no "
                             "watchdog) to 1000000", env);
        timeout_s = t;
    }

    /* 3. the SIGTERM line, the stop inside MPI_Finalize, the thread */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    int key;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &key, NULL);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);

    pthread_mutex_lock(&mu);
    last_event = now_s();
    atomic_store(&tick_ms, now_ms());
    stopping = 0;
    running = pthread_create(&thread, NULL, watchdog, NULL) == 0;
    pthread_mutex_unlock(&mu);
    atomic_store(&armed, 1);
}
