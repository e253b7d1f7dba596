/* outputs.c: see outputs.h. Rank 0 decides; comm_require_all tells every rank. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#include "comm.h"
#include "files.h"
#include "guard.h"
#include "outputs.h"

#define LOCK_NAME ".lock"

/* The path as a message shows it, in quotes: control characters as \xNN (the message stays one
 * line), and a path over CLI_MAX_DIR_PATH bytes cut, saying so. */
static void show_path(char *out, size_t len, const char *path) {
    size_t n = strlen(path), o = 0, shown = n > CLI_MAX_DIR_PATH ? 60 : n;
    o += (size_t)snprintf(out + o, len - o, "'");
    for (size_t i = 0; i < shown && o + 8 < len; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = 0;
    if (shown < n) snprintf(out + o, len - o, "...' (%zu bytes, shown shortened)", n);
    else snprintf(out + o, len - o, "'");
}

/* A copy of path without its trailing slashes ("/" stays "/"). */
static char *trimmed(const char *path) {
    char *p = strdup(path);
    size_t n = p ? strlen(p) : 0;
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    return p;
}

/* The first directory of `path` that does not exist yet (a copy to free), or NULL when the whole
 * path exists. */
static char *first_missing(const char *path) {
    char *p = trimmed(path), *top = NULL;
    struct stat st;
    while (p && stat(p, &st) != 0) {
        free(top);
        top = strdup(p);
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == 0) { *slash = 0; slash = strrchr(p, '/'); }
        if (!slash) { free(p); p = strdup("."); break; }
        if (slash == p) { p[1] = 0; break; }
        *slash = 0;
    }
    free(p);
    return top;
}

/* The nearest ancestor of `path` (or path itself) that exists: a copy to free. */
static char *existing_ancestor(const char *path) {
    char *p = trimmed(path);
    struct stat st;
    while (p && lstat(p, &st) != 0) {
        char *slash = strrchr(p, '/');
        if (!slash) { free(p); return strdup("."); }
        if (slash == p) { p[1] = 0; break; }
        *slash = 0;
    }
    return p;
}

/* Removes the empty directories from `path` up to and including `top` (what make_dirs made). */
static void remove_created(const char *path, const char *top) {
    char *p = trimmed(path);
    size_t top_len = strlen(top);
    while (p && strlen(p) >= top_len) {
        rmdir(p);
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = 0;
    }
    free(p);
}

/* Can a file be created in the directory `dir`? 0, or an errno. access(W_OK) says yes to root on
 * a read-only mount, and nothing about /proc: only a real create tells. */
static int probe_write(const char *dir) {
    char *probe = NULL;
    if (asprintf(&probe, "%s/.write_test.%ld", dir, (long)getpid()) < 0) return ENOMEM;
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK, 0644), err = fd < 0 ? errno : 0;
    if (fd >= 0) { close(fd); unlink(probe); }
    free(probe);
    return err;
}

/* The absolute path with every existing part resolved (symbolic links, "..", "."), the missing
 * tail appended by name: two spellings of one place give one string. A copy to free. */
static char *resolve(const char *path) {
    char *p = trimmed(path);
    if (!p) return NULL;
    char *real = realpath(p, NULL);
    if (real) { free(p); return real; }
    char *slash = strrchr(p, '/');
    char *parent, *name;
    if (!slash) { parent = strdup("."); name = strdup(p); }
    else if (slash == p) { parent = strdup("/"); name = strdup(slash + 1); }
    else { *slash = 0; parent = strdup(p); name = strdup(slash + 1); }
    free(p);
    char *up = parent ? resolve(parent) : NULL, *out = NULL;
    free(parent);
    if (up && name) {
        if (strcmp(name, ".") == 0 || name[0] == 0) out = strdup(up);
        else if (strcmp(name, "..") == 0) {
            char *s = strrchr(up, '/');
            if (s && s != up) *s = 0;
            else up[1] = 0;
            out = strdup(up);
        } else if (asprintf(&out, "%s%s%s", up, strcmp(up, "/") == 0 ? "" : "/", name) < 0) out = NULL;
    }
    free(up);
    free(name);
    return out;
}

/* A name (between slashes) longer than NAME_MAX: its length, else 0. */
static size_t long_name(const char *path) {
    size_t run = 0, worst = 0;
    for (const char *c = path;; c++) {
        if (*c == '/' || *c == 0) { if (run > worst) worst = run; run = 0; if (!*c) break; }
        else run++;
    }
    return worst > NAME_MAX ? worst : 0;
}

/* Rank 0: the reason `p` alone cannot be used, or NULL. Creates nothing. */
/* Is one of the CSV files a run writes into a directory (NAME.csv, each written aside and renamed
 * into place) a symbolic link there? Says which in `why`. */
static bool csv_link_inside(const char *dir, char *why, size_t len) {
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".csv") != 0) continue;
        char *p = NULL;
        if (asprintf(&p, "%s/%s", dir, e->d_name) >= 0 && path_is_link(p)) {
            snprintf(why, len, "%s is a symbolic link: the run writes its CSV files aside and renames them into "
                     "place, never through or over a link; move the link out", e->d_name);
            found = true;
        }
        free(p);
    }
    if (d) closedir(d);
    return found;
}

static const char *own_problem(const run_path *p, char *why, size_t len) {
    const char *path = p->path;
    bool dir = p->kind == RUN_PATH_OUTPUT_DIR;
    if (!*path) return dir ? "the path is empty: expected a directory" : "the path is empty: expected a file";
    size_t n = strlen(path), name;
    if (n > CLI_MAX_DIR_PATH) {
        snprintf(why, len, "the path is %zu bytes long: at most %d, to leave room for the names of the files "
                 "written there", n, CLI_MAX_DIR_PATH);
        return why;
    }
    for (const char *c = path; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) return "the path holds a control character";
    if ((name = long_name(path)) != 0) {
        snprintf(why, len, "cannot create that %s (%s): a name of %zu bytes, at most %d", dir ? "directory" : "file",
                 strerror(ENAMETOOLONG), name, NAME_MAX);
        return why;
    }
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (!dir && path_is_link(path))
        return "it is a symbolic link: the file is written aside and renamed into its place, which would replace "
               "the link (a run never writes through or over one): remove the link or name another file";
    if (dir && exists && !S_ISDIR(st.st_mode)) return "it exists and is not a directory";
    if (dir && exists && csv_link_inside(path, why, len)) return why;
    if (!dir && path[n - 1] == '/') return "it ends with '/': expected a file, not a directory";
    if (!dir && exists && S_ISDIR(st.st_mode)) return "it is a directory: expected a file";
    if (!dir && exists && !S_ISREG(st.st_mode))
        return "it exists and is not a regular file (a device, FIFO or socket): the file is written aside and "
               "renamed into its place";
    /* where the first file (or directory) would be created: the directory itself, or for a file
     * (written aside, then renamed) its directory; else the nearest ancestor that exists */
    char *where;
    if (dir && exists) where = strdup(path);
    else {
        char *parent = trimmed(path), *slash = parent ? strrchr(parent, '/') : NULL;
        if (parent && !dir) {
            if (!slash) { free(parent); parent = strdup("."); }
            else if (slash == parent) parent[1] = 0;
            else *slash = 0;
        }
        where = parent ? existing_ancestor(parent) : NULL;
        free(parent);
    }
    if (!where) return "out of memory";
    const char *problem = NULL;
    struct stat w;
    if (stat(where, &w) != 0 || !S_ISDIR(w.st_mode)) {
        snprintf(why, len, "cannot create that %s (%s)", dir ? "directory" : "file", strerror(ENOTDIR));
        problem = why;
    } else {
        int err = probe_write(where);
        if (err) {
            if (dir && exists) snprintf(why, len, "cannot write in that directory (%s)", strerror(err));
            else snprintf(why, len, "cannot create that %s (%s)", dir ? "directory" : "file", strerror(err));
            problem = why;
        }
    }
    free(where);
    return problem;
}

/* Is `a` the same file as `b`? The same inode when both exist, else the same resolved path. */
static bool same_place(const char *a, const char *ra, const char *b, const char *rb) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return ra && rb && strcmp(ra, rb) == 0;
}

/* Does the resolved path `r` lie inside the resolved directory `d`? */
static bool inside(const char *r, const char *d) {
    if (!r || !d) return false;
    size_t n = strlen(d);
    if (strcmp(d, "/") == 0) return r[1] != 0;
    return strncmp(r, d, n) == 0 && r[n] == '/';
}

void run_paths_check(const run_path *paths, int n) {
    char why[512], msg[8192] = "";
    bool bad = false;
    if (comm_world()->rank == 0) {
        char **res = calloc((size_t)n, sizeof *res);
        for (int i = 0; i < n && !bad; i++) {
            const run_path *p = &paths[i];
            if (!p->path) continue;
            char shown[4 * CLI_MAX_DIR_PATH + 80];
            show_path(shown, sizeof shown, p->path);
            const char *problem = p->kind == RUN_PATH_INPUT ? NULL : own_problem(p, why, sizeof why);
            if (problem) {
                snprintf(msg, sizeof msg, "%s %s is not valid: %s", p->flag, shown, problem);
                bad = true;
            }
            if (!bad && p->path[0]) res[i] = resolve(p->path);
        }
        /* each path against the others: outputs never on an input or on each other, nothing
         * inside a directory the run owns whole */
        for (int i = 0; i < n && !bad; i++) {
            const run_path *a = &paths[i];
            if (!a->path) continue;
            char sa[4 * CLI_MAX_DIR_PATH + 80], sb[4 * CLI_MAX_DIR_PATH + 80];
            show_path(sa, sizeof sa, a->path);
            for (int j = 0; j < n && !bad; j++) {
                const run_path *b = &paths[j];
                if (j == i || !b->path) continue;
                show_path(sb, sizeof sb, b->path);
                bool a_out = a->kind != RUN_PATH_INPUT, b_out = b->kind != RUN_PATH_INPUT;
                if (a_out && !b_out && same_place(a->path, res[i], b->path, res[j])) {
                    snprintf(msg, sizeof msg, "%s %s is not valid: it is the same file as %s %s, which the run reads: "
                             "writing it would destroy the input", a->flag, sa, b->flag, sb);
                    bad = true;
                } else if (a_out && b_out && j < i && same_place(a->path, res[i], b->path, res[j])) {
                    snprintf(msg, sizeof msg, "%s %s is not valid: it is the same place as %s %s: each output needs "
                             "a path of its own", a->flag, sa, b->flag, sb);
                    bad = true;
                } else if (b->owned && inside(res[i], res[j])) {
                    snprintf(msg, sizeof msg, "%s %s is not valid: it lies inside %s %s, %s: use a path outside it",
                             a->flag, sa, b->flag, sb, b->owned);
                    bad = true;
                }
            }
        }
        for (int i = 0; i < n; i++) free(res[i]);
        free(res);
    }
    comm_require_all(!bad, "%s", msg);
}

/* ---- creation and the locks (rank 0) ---- */

typedef struct { char *dir, *top, *lock_path; int fd; dev_t dev; ino_t ino; } made;
static made made_list[8];
static int n_made;
static bool hooks_set;

/* Releases this process's locks (the lock files removed while still ours) and, when `undo`,
 * removes the directories run_paths_create made, if they are still empty. */
static void release(bool undo) {
    for (int i = n_made - 1; i >= 0; i--) {
        made *m = &made_list[i];
        if (m->fd >= 0) {
            struct stat st;
            if (stat(m->lock_path, &st) == 0 && st.st_dev == m->dev && st.st_ino == m->ino) unlink(m->lock_path);
            close(m->fd);
            m->fd = -1;
        }
        if (undo && m->top) remove_created(m->dir, m->top);
        free(m->dir); free(m->top); free(m->lock_path);
        m->dir = m->top = m->lock_path = NULL;
    }
    n_made = 0;
}
static void release_at_exit(void) { release(false); }
/* A stop signal (guard_on_stop: in the handler, stat, unlink and rmdir only): the lock files
 * removed, as at exit (the kernel drops the locks themselves with the process), and a directory
 * this run created removed again when nothing else is in it. */
static void unlock_on_stop(void) {
    for (int i = 0; i < n_made; i++) {
        made *m = &made_list[i];
        struct stat st;
        if (m->fd >= 0 && m->lock_path && stat(m->lock_path, &st) == 0 && st.st_dev == m->dev && st.st_ino == m->ino)
            unlink(m->lock_path);
        if (m->top && m->dir) rmdir(m->dir);   /* (fails, harmlessly, unless it is empty) */
    }
}
static void release_on_refusal(void) { release(true); }

/* Takes the lock file `lock` (DIR/.lock for a directory, DIR/.NAME.lock beside a file) for this
 * process, its pid and host written inside. NULL, or the reason it cannot. */
static const char *take_lock(made *m, const char *lock, char *why, size_t len) {
    if (!(m->lock_path = strdup(lock))) return "out of memory";
    for (int attempt = 0; attempt < 5; attempt++) {
        int fd = open(m->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        if (fd < 0) { snprintf(why, len, "cannot create its lock file %s (%s)", m->lock_path, strerror(errno)); return why; }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            char other[128] = "";
            ssize_t got = read(fd, other, sizeof other - 1);
            close(fd);
            if (err != EWOULDBLOCK) {
                snprintf(why, len, "cannot lock %s (%s)", m->lock_path, strerror(err));
                return why;
            }
            other[got > 0 ? got : 0] = 0;
            other[strcspn(other, "\n")] = 0;
            snprintf(why, len, "another run is writing there (%s%s, holding %s): one run per output at a "
                     "time; wait for it to end or choose another path", other[0] ? "" : "its pid unknown", other,
                     m->lock_path);
            return why;
        }
        /* the file may have been removed by the run that held it, between our open and flock */
        struct stat by_fd, by_name;
        if (fstat(fd, &by_fd) == 0 && stat(m->lock_path, &by_name) == 0 && by_fd.st_dev == by_name.st_dev &&
            by_fd.st_ino == by_name.st_ino) {
            char host[64] = "?", text[128];
            gethostname(host, sizeof host - 1);
            int k = snprintf(text, sizeof text, "pid %ld on %s\n", (long)getpid(), host);
            if (ftruncate(fd, 0) != 0 || write(fd, text, (size_t)k) != k) { /* the lock holds all the same */ }
            m->fd = fd;
            m->dev = by_fd.st_dev;
            m->ino = by_fd.st_ino;
            return NULL;
        }
        close(fd);
    }
    snprintf(why, len, "cannot lock %s: it keeps being replaced", m->lock_path);
    return why;
}

void run_paths_create(const run_path *paths, int n) {
    char why[512], msg[8192] = "";
    bool bad = false;
    if (comm_world()->rank == 0) {
        if (!hooks_set) {
            atexit(release_at_exit);
            comm_on_usage_exit(release_on_refusal);
            guard_on_stop(unlock_on_stop);
            hooks_set = true;
        }
        for (int i = 0; i < n && !bad; i++) {
            const run_path *p = &paths[i];
            if (p->path && p->kind == RUN_PATH_OUTPUT_FILE && p->lock) {   /* a file: DIR/.NAME.lock beside it */
                if (n_made == (int)(sizeof made_list / sizeof *made_list)) break;
                made *m = &made_list[n_made++];
                *m = (made){trimmed(p->path), NULL, NULL, -1, 0, 0};
                char *slash = m->dir ? strrchr(m->dir, '/') : NULL, *lock = NULL;
                if (m->dir && asprintf(&lock, "%.*s%s.%s.lock", slash ? (int)(slash - m->dir + 1) : 0, m->dir,
                                       "", slash ? slash + 1 : m->dir) < 0) lock = NULL;
                const char *problem = lock ? take_lock(m, lock, why, sizeof why) : "out of memory";
                free(lock);
                if (problem) {
                    char shown[4 * CLI_MAX_DIR_PATH + 80];
                    show_path(shown, sizeof shown, p->path);
                    snprintf(msg, sizeof msg, "%s %s is not valid: %s", p->flag, shown, problem);
                    bad = true;
                }
                continue;
            }
            if (!p->path || p->kind != RUN_PATH_OUTPUT_DIR || !p->create) continue;
            if (n_made == (int)(sizeof made_list / sizeof *made_list)) break;
            char shown[4 * CLI_MAX_DIR_PATH + 80];
            show_path(shown, sizeof shown, p->path);
            made *m = &made_list[n_made++];
            *m = (made){trimmed(p->path), first_missing(p->path), NULL, -1, 0, 0};
            const char *problem = NULL;
            errno = 0;
            if (make_dirs(p->path) != 0) {
                snprintf(why, sizeof why, "cannot create that directory (%s)", strerror(errno ? errno : EIO));
                problem = why;
            } else {
                int err = probe_write(p->path);
                if (err) { snprintf(why, sizeof why, "cannot write in that directory (%s)", strerror(err)); problem = why; }
            }
            char *lock = NULL;
            if (!problem && p->lock && asprintf(&lock, "%s/%s", m->dir, LOCK_NAME) < 0) problem = "out of memory";
            if (!problem && p->lock) problem = take_lock(m, lock, why, sizeof why);
            free(lock);
            if (problem) {
                snprintf(msg, sizeof msg, "%s %s is not valid: %s", p->flag, shown, problem);
                bad = true;
            }
        }
        if (bad) release(true);
    }
    comm_require_all(!bad, "%s", msg);
}
