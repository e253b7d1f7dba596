/* guard.c: see guard.h. Argument agreement at start, a watchdog thread, and the one line that
 * explains how a job ended when a rank dies, crashes or is interrupted.
 *
 * The watchdog thread never calls MPI except MPI_Abort, which Open MPI accepts from any thread:
 * it asks mpirun to end every rank of the job (a stopped rank too: mpirun sends SIGCONT, then
 * SIGTERM, then SIGKILL) with the given status.
 *
 * Who explains the end. The ranks of a node share a small table (an MPI shared-memory window,
 * allocated once in guard_init): each rank's pid and state, and a token. Whatever explains the end
 * of the job (the watchdog firing, a rank's own crash, mpirun's SIGTERM) first takes the token
 * with an atomic compare-and-swap; a rank that cannot take it stays silent, so one line is printed
 * however the ranks' signals interleave and however loaded the machine is (no clock is read).
 * A rank that receives mpirun's SIGTERM looks in the table for the rank that caused it: one whose
 * process is gone although it neither reached MPI_Finalize nor got the SIGTERM itself.
 */
#include "guard.h"

#include <errno.h>
#include <fcntl.h>
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
static char in_note[160];         /* inside a call: what it waits for (guard_note), or ""     */
static int my_rank, world_size;

/* Read by the signal handlers, hence atomics of integer type (lock-free, signal-safe). */
static atomic_int armed;          /* between guard_init and MPI_Finalize                   */
static atomic_int aborting;       /* the watchdog fired: this rank is ending the job      */

/* ---- the node's table: who explains the end of the job (see the top of this file) ---- */

enum { ST_EMPTY, ST_RUNNING, ST_TERMINATED, ST_FINISHED };
typedef struct { int pid, rank, state, pad; } guard_slot;
typedef struct {
    int token;             /* 0: nobody has explained the end yet; else 1 + the rank that did  */
    int n;                 /* slots: the ranks of this node                                     */
    guard_slot slot[];
} guard_table;
static guard_table *table;        /* NULL if the window could not be made: rank 0 speaks then */
static int my_slot;
static int world_here;            /* every rank of the job runs on this node                  */
static int launched;              /* started by mpirun (its parent), not a singleton          */

static int load(const int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
/* The table as a signal handler may use it: NULL from the start of MPI_Finalize on, which frees
 * the window (a handler that ran after it, on mpirun's SIGTERM to a rank that had already
 * finalized, wrote into unmapped memory and crashed). */
static guard_table *table_now(void) { return __atomic_load_n(&table, __ATOMIC_SEQ_CST); }

/* 1 if this rank is the one to explain (it took the token, or had it); `fallback` without a table. */
static int claim(int fallback) {
    guard_table *t = table_now();
    if (!t) return fallback;
    int none = 0;
    return __atomic_compare_exchange_n(&t->token, &none, my_rank + 1, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST) || load(&t->token) == my_rank + 1;
}

int guard_claim_line(void) { return claim(1); }

/* A line built without printf, for the signal handlers (async-signal-safe: write only). */
typedef struct { char b[480]; size_t n; } guard_line;
static void add(guard_line *l, const char *s) {
    while (*s && l->n < sizeof l->b - 1) l->b[l->n++] = *s++;
}
static void add_int(guard_line *l, long v) {
    char d[24];
    int k = 0;
    if (v < 0) { add(l, "-"); v = -v; }
    do d[k++] = (char)('0' + v % 10); while ((v /= 10) && k < 23);
    while (k > 0 && l->n < sizeof l->b - 1) l->b[l->n++] = d[--k];
}
static void emit(guard_line *l) {
    l->b[l->n++] = '\n';   /* add() keeps one byte free for it */
    ssize_t rc = write(STDERR_FILENO, l->b, l->n);
    (void)rc;
}
static void add_who(guard_line *l) {   /* "error: " or "error: rank 3: " as the watchdog's line */
    add(l, "error: ");
    if (my_rank != 0) { add(l, "rank "); add_int(l, my_rank); add(l, ": "); }
}
static const char *signal_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV, an invalid memory access";
    case SIGBUS:  return "SIGBUS, a bus error";
    case SIGFPE:  return "SIGFPE, an arithmetic error";
    case SIGILL:  return "SIGILL, an illegal instruction";
    case SIGABRT: return "SIGABRT, abort()";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT:  return "SIGINT";
    case SIGHUP:  return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default:      return "";
    }
}
static void add_signal(guard_line *l, int sig) {
    add(l, "signal "); add_int(l, sig);
    if (*signal_name(sig)) { add(l, " ("); add(l, signal_name(sig)); add(l, ")"); }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    in_note[0] = '\0';
    last_event = now_s();
    pthread_mutex_unlock(&mu);
}

void guard_end(void) {
    pthread_mutex_lock(&mu);
    if (in_what) snprintf(last_what, sizeof last_what, "%s on group %s", in_what, in_group);
    in_what = NULL;
    in_note[0] = '\0';
    last_event = now_s();
    pthread_mutex_unlock(&mu);
}

void guard_note(const char *note) {
    pthread_mutex_lock(&mu);
    snprintf(in_note, sizeof in_note, "%s", note ? note : "");
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
    if (!claim(1)) {   /* another rank has explained already (it crashed, or its watchdog fired) */
        MPI_Abort(MPI_COMM_WORLD, GUARD_EXIT_STALLED);
        _exit(GUARD_EXIT_STALLED);
    }
    char line[560], who[32] = "";
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
        if (now - last_tick > 1.0) last_event += now - last_tick - poll;
        last_tick = now;

        double waited = now - last_event;
        if (timeout_s > 0 && waited > timeout_s + grace_s()) {
            char what[360];
            int inside = in_what != NULL;
            if (inside) snprintf(what, sizeof what, "%s on group %s%s%s%s", in_what, in_group,
                                 in_note[0] ? " (" : "", in_note, in_note[0] ? ")" : "");
            else snprintf(what, sizeof what, "%s", last_what);
            double t = timeout_s;
            pthread_mutex_unlock(&mu);
            fire(waited, what, inside, t);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* ---- the signals that end a rank ----
 * Only async-signal-safe calls in the handlers: write, kill, open, read, close, getppid,
 * sigaction, raise, and atomic loads and stores. */

/* Is the process `pid` still running? 0 if it is gone or a zombie; *sig is then the signal that
 * killed it when the kernel still knows (a zombie not yet reaped by mpirun), else 0. */
static int process_running(int pid, int *sig) {
    *sig = 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    guard_line path = {.n = 0};
    add(&path, "/proc/"); add_int(&path, pid); add(&path, "/stat");
    path.b[path.n] = 0;
    int fd = open(path.b, O_RDONLY);
    if (fd < 0) return 1;   /* no /proc: take kill's word */
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    const char *p = NULL;
    for (ssize_t i = 0; i < n; i++) if (buf[i] == ')') p = buf + i;   /* after the command name */
    if (!p || p[1] != ' ' || (p[2] != 'Z' && p[2] != 'X')) return 1;
    /* field 3 is the state; field 52 the exit status (Linux 3.5 and later) */
    int field = 3;
    for (const char *q = p + 2; *q; q++) {
        if (*q != ' ') continue;
        if (++field == 52) {
            long code = 0;
            for (q++; *q >= '0' && *q <= '9'; q++) code = code * 10 + (*q - '0');
            *sig = (int)(code & 0x7f);
            break;
        }
    }
    return 0;
}

static void mark(int from, int to) {   /* this rank's state in the table: from -> to */
    guard_table *t = table_now();
    if (!t) return;
    int expected = from;
    __atomic_compare_exchange_n(&t->slot[my_slot].state, &expected, to, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
}

/* guard_on_stop's functions, run once by the first stop signal */
static void (*stop_fns[8])(void);
static atomic_int n_stop_fns, stop_fns_ran;
void guard_on_stop(void (*fn)(void)) {
    int i = atomic_load(&n_stop_fns);
    if (i < 8) { stop_fns[i] = fn; atomic_store(&n_stop_fns, i + 1); }
}
static void run_stop_fns(void) {
    if (atomic_exchange(&stop_fns_ran, 1)) return;
    for (int i = 0; i < atomic_load(&n_stop_fns); i++) stop_fns[i]();
}

/* SIGTERM, SIGINT, SIGHUP or SIGQUIT. From mpirun (the parent) it is ending the job: a rank died or exited early,
 * another rank's watchdog called MPI_Abort, or mpirun itself was interrupted (it sends SIGTERM to
 * the ranks for a SIGINT too). From anyone else it is this rank that was interrupted. */
static void report_stop(int sig, const siginfo_t *info) {
    guard_line l = {.n = 0};
    int from_mpirun = info && info->si_code == SI_USER && info->si_pid == getppid() && launched;
    if (!from_mpirun) {
        if (!claim(1)) return;
        if (world_size > 1) { add(&l, "error: rank "); add_int(&l, my_rank); add(&l, " received "); }
        else add(&l, "error: interrupted by ");
        add(&l, signal_name(sig));
        if (info && info->si_code == SI_USER && info->si_pid > 0) {
            add(&l, " from pid "); add_int(&l, info->si_pid);
        }
        add(&l, "; the run ends with exit status "); add_int(&l, 128 + sig);
        if (world_size > 1) add(&l, ", and mpirun ends the other ranks");
        emit(&l);
        return;
    }
    /* the cause: a rank of this node whose process is gone although it neither reached
     * MPI_Finalize nor received this SIGTERM (it marks that first thing, below) */
    int cause = -1, cause_pid = 0, cause_sig = 0;
    guard_table *t = table_now();
    for (int i = 0; t && i < t->n && cause < 0; i++) {
        const guard_slot *s = &t->slot[i];
        int pid = load(&s->pid), sig_i;
        if (i == my_slot || pid <= 0 || load(&s->state) != ST_RUNNING) continue;
        if (!process_running(pid, &sig_i)) { cause = s->rank; cause_pid = pid; cause_sig = sig_i; }
    }
    if (cause >= 0) {
        if (!claim(0)) return;
        add_who(&l);
        add(&l, "rank "); add_int(&l, cause); add(&l, " (pid "); add_int(&l, cause_pid);
        if (cause_sig) { add(&l, ") was killed by "); add_signal(&l, cause_sig); }
        else add(&l, ") died or exited without the others (an exit status of 128+N means it was "
                     "killed by signal N)");
        add(&l, "; mpirun ended the job");
    } else if (t && world_here) {
        if (!claim(my_rank == 0)) return;
        add(&l, "error: the job was interrupted: mpirun received SIGINT (Ctrl-C), SIGTERM or SIGHUP and "
                "ended the ranks (mpirun alone then exits with status 1; make run-NN with 128 + the signal)");
    } else {   /* ranks on other nodes: the cause may be there; rank 0 alone speaks, as before */
        if (my_rank != 0 || !claim(1)) return;
        add(&l, "error: mpirun ended the job: another rank died or exited early (an exit status "
                "of 128+N means a rank was killed by signal N), or the job was interrupted");
    }
    emit(&l);
}

/* A stop signal after the watchdog stopped (MPI_Finalize: the run's results are all printed and
 * written): one line all the same, from rank 0 alone, so that no signal ends a run silently. Not
 * for mpirun's own SIGTERM then: it is ending the job because a rank has exited (a refusal whose
 * line is already out, say), and that rank spoke. */
static void report_late_stop(int sig, const siginfo_t *info) {
    if (info && info->si_code == SI_USER && info->si_pid == getppid() && launched) return;
    if (!claim(my_rank == 0)) return;
    guard_line l = {.n = 0};
    add(&l, "error: interrupted by ");
    add(&l, signal_name(sig));
    add(&l, " as the run ended (what it printed and wrote above is complete); exit status ");
    add_int(&l, 128 + sig);
    emit(&l);
}

static void on_stop_signal(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    int saved = errno;
    mark(ST_RUNNING, ST_TERMINATED);   /* first: no other rank may take this exit for a cause */
    if (atomic_load(&armed) && !atomic_load(&aborting)) report_stop(sig, info);
    else if (!atomic_load(&aborting)) report_late_stop(sig, info);
    run_stop_fns();   /* the harness's files into place, its locks removed (guard_on_stop) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    errno = saved;
    raise(sig);   /* the rank ends with 128 + sig */
}

/* A crash: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT. This rank says so first, then the handler
 * that was there before (Open MPI's backtrace, or a sanitizer's report) runs as it would have. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_FATAL (int)(sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction fatal_before[N_FATAL];

static void on_fatal(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    int saved = errno;
    if (atomic_load(&armed) && claim(1)) {
        guard_line l = {.n = 0};
        add(&l, "error: rank "); add_int(&l, my_rank); add(&l, " crashed with ");
        add_signal(&l, sig);
        add(&l, "; the job ends with exit status "); add_int(&l, 128 + sig);
        emit(&l);
    }
    for (int i = 0; i < N_FATAL; i++)
        if (fatal_signals[i] == sig) {
            struct sigaction before = fatal_before[i];
            if (!(before.sa_flags & SA_SIGINFO) && before.sa_handler == SIG_IGN)
                before.sa_handler = SIG_DFL;
            sigaction(sig, &before, NULL);
        }
    errno = saved;
    /* A fault (si_code > 0) happens again on return, now to the handler from before; a signal
     * that was sent (kill, abort) is sent again. */
    if (!info || info->si_code <= 0) raise(sig);
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
    mark(ST_RUNNING, ST_FINISHED);   /* this rank's exit from now on is no cause */
    __atomic_store_n(&table, NULL, __ATOMIC_SEQ_CST);   /* MPI_Finalize frees the window next */
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

/* The environment variables every rank must agree on: what carries the collectives, and NCCL's
 * settings that change which algorithm, protocol or channels a collective uses (ranks of one
 * communicator that disagree wait for each other in different kernels). A rank started with
 * another value, as in `mpirun -np 1 -x COMM=mpi 08 : -np 1 -x COMM=nccl-sim 08`, would wait
 * for the others forever; instead the lowest such rank names the variable and both values, and
 * every rank exits with status 2. Unset and set to "" are the same. Per-node settings (NCCL's
 * network interfaces and adapters, its debug output) may differ and are not compared. */
static const char *const agreed_settings[] = {
    "COMM", "NCCL_ALGO", "NCCL_PROTO", "NCCL_RUNTIME_CONNECT", "NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS", NULL};
enum { SETTING_CHARS = 128 };

static void agree_on_settings(void) {
    int n = 0;
    while (agreed_settings[n]) n++;
    char rank0[n][SETTING_CHARS], mine[n][SETTING_CHARS];
    for (int i = 0; i < n; i++) {
        const char *v = getenv(agreed_settings[i]);
        snprintf(mine[i], SETTING_CHARS, "%s", v ? v : "");
    }
    memcpy(rank0, mine, sizeof rank0);
    MPI_Bcast(rank0, (int)sizeof rank0, MPI_CHAR, 0, MPI_COMM_WORLD);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (strcmp(mine[i], rank0[i]) != 0) bad = i;
    comm_require_all(bad < 0, "the ranks were started with different settings: %s is '%s' on rank %d and '%s' on "
                     "rank 0; every rank must get the same (mpirun -x %s=...)", bad >= 0 ? agreed_settings[bad] : "",
                     bad >= 0 ? mine[bad] : "", my_rank, bad >= 0 ? rank0[bad] : "", bad >= 0 ? agreed_settings[bad] : "");
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

    /* 1b. ... and the same settings of what the ranks do together */
    agree_on_settings();

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

    /* 3. the node's table (never freed: a handler may read it until the process ends) */
    launched = getenv("OMPI_COMM_WORLD_RANK") != NULL;   /* mpirun sets it; a singleton has not */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int node_size, node_rank;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_rank(node, &node_rank);
    world_here = node_size == world_size;
    MPI_Aint bytes = (MPI_Aint)(sizeof(guard_table) + (size_t)node_size * sizeof(guard_slot));
    void *mine_base = NULL, *base = NULL;
    MPI_Win win;
    MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
    int ok_win = MPI_Win_allocate_shared(node_rank == 0 ? bytes : 0, 1, MPI_INFO_NULL, node,
                                         &mine_base, &win) == MPI_SUCCESS;
    MPI_Aint got = 0;
    int disp;
    if (ok_win) ok_win = MPI_Win_shared_query(win, 0, &got, &disp, &base) == MPI_SUCCESS &&
                         base && got >= bytes;
    int all_ok;
    MPI_Allreduce(&ok_win, &all_ok, 1, MPI_INT, MPI_MIN, node);
    if (all_ok) {
        guard_table *t = base;
        if (node_rank == 0) { memset(t, 0, (size_t)bytes); t->n = node_size; }
        MPI_Barrier(node);
        my_slot = node_rank;
        t->slot[my_slot].rank = my_rank;
        __atomic_store_n(&t->slot[my_slot].state, ST_RUNNING, __ATOMIC_SEQ_CST);
        __atomic_store_n(&t->slot[my_slot].pid, (int)getpid(), __ATOMIC_SEQ_CST);
        table = t;
    }
    MPI_Comm_free(&node);

    /* 4. the signal handlers, the stop inside MPI_Finalize, the thread. MPI_Init has installed
     * Open MPI's crash handlers by now: ours replace them and call them after their line. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_stop_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t k = 0; k < sizeof stop_signals / sizeof *stop_signals; k++) {
        int sig = stop_signals[k];
        struct sigaction before;   /* a signal ignored by whoever started us stays ignored */
        if (sigaction(sig, NULL, &before) == 0 && !(before.sa_flags & SA_SIGINFO) &&
            before.sa_handler == SIG_IGN)
            continue;
        sigaction(sig, &sa, NULL);
    }
    sa.sa_sigaction = on_fatal;
    for (int i = 0; i < N_FATAL; i++) sigaction(fatal_signals[i], &sa, &fatal_before[i]);
    int key;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &key, NULL);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);

    pthread_mutex_lock(&mu);
    last_event = now_s();
    stopping = 0;
    running = pthread_create(&thread, NULL, watchdog, NULL) == 0;
    pthread_mutex_unlock(&mu);
    atomic_store(&armed, 1);
}
