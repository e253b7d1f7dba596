/* files.c: output files written aside and renamed into place, mkdir -p, whole-file reads (files.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <limits.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "files.h"
#include "guard.h"
#include "log.h"

/* mkdir -p. The path is copied whole (no fixed buffer to truncate it into); an empty path, or
 * one longer than PATH_MAX, is refused with errno ENOENT or ENAMETOOLONG. A path that exists but
 * is not a directory fails with ENOTDIR. On failure the directories this call created are
 * removed again, so a refused path leaves nothing behind. */
int make_dirs(const char *path) {
    size_t n = path ? strlen(path) : 0;
    if (n == 0) { errno = ENOENT; return -1; }
    if (n >= PATH_MAX) { errno = ENAMETOOLONG; return -1; }
    char *buf = malloc(n + 1);
    if (!buf) { errno = ENOMEM; return -1; }
    memcpy(buf, path, n + 1);
    /* created[] holds the offsets where each directory this call made ends (buf[k] = 0 there) */
    size_t *created = malloc((n + 1) * sizeof *created);
    int n_created = 0, rc = 0, err = 0;
    if (!created) { free(buf); errno = ENOMEM; return -1; }
    for (size_t k = 1; k <= n && rc == 0; k++) {
        if (k < n && buf[k] != '/') continue;
        if (buf[k - 1] == '/') continue;   /* "a//b" or a trailing '/' */
        char saved = buf[k];
        buf[k] = 0;
        if (mkdir(buf, 0755) == 0) created[n_created++] = k;
        else if (errno != EEXIST) { rc = -1; err = errno; }
        buf[k] = saved;
    }
    struct stat st;
    if (rc == 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) { rc = -1; err = ENOTDIR; }
    if (rc != 0)
        for (int i = n_created - 1; i >= 0; i--) {   /* undo, deepest first */
            buf[created[i]] = 0;
            rmdir(buf);
        }
    free(created);
    free(buf);
    errno = err;
    return rc;
}

/* The output files open now: each is written under a temporary name beside its own and renamed
 * into place by csv_close, so the file is the previous whole one or the new whole one. */
typedef struct { FILE *f; char *path, *tmp; } out_file;
static out_file outs[32];
static char write_error[1200];

static void note_write_error(const char *path, int err) {
    if (!write_error[0]) snprintf(write_error, sizeof write_error, "cannot write %s: %s", path, strerror(err ? err : EIO));
}
const char *file_write_error(void) { return write_error[0] ? write_error : NULL; }

static out_file *find_out(FILE *f) {
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) if (f && outs[i].f == f) return &outs[i];
    return NULL;
}

static void forget_out(out_file *o, bool remove_tmp) {
    if (remove_tmp && o->tmp) unlink(o->tmp);
    free(o->path);
    free(o->tmp);
    *o = (out_file){0};
}

/* A stop signal (guard.h: guard_on_stop, in the handler: rename only): each file being written
 * goes into its place as it is, every row so far flushed (csv_row), so an interrupted run's
 * metrics.csv holds its own rows up to its last finished step, not the previous run's. */
static void keep_rows_on_stop(void) {
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++)
        if (outs[i].f && outs[i].tmp && outs[i].path) rename(outs[i].tmp, outs[i].path);
}

FILE *out_open(const char *path, const char *header, bool append) {
    static bool registered;
    if (!registered) { guard_on_stop(keep_rows_on_stop); registered = true; }
    out_file *o = find_out(NULL);
    for (size_t i = 0; !o && i < sizeof outs / sizeof *outs; i++) if (!outs[i].f) o = &outs[i];
    if (!o) { note_write_error(path, EMFILE); return NULL; }
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash && slash != dir) { *slash = 0; make_dirs(dir); }
    free(dir);
    if (path_is_link(path)) {   /* (checked before the first step for --out: one made since) */
        if (!write_error[0])
            snprintf(write_error, sizeof write_error, "cannot write %s: it is a symbolic link, which a run never "
                     "writes through or renames over", path);
        return NULL;
    }
    char *tmp = temp_name(path);   /* (unique to this run: never a file another run writes) */
    if (!tmp) { note_write_error(path, ENOMEM); return NULL; }
    FILE *f = create_new_file(tmp, "w");
    if (!f) { note_write_error(path, errno); free(tmp); return NULL; }
    *o = (out_file){f, strdup(path), tmp};
    bool empty = true;
    if (append) {   /* the rows already there first */
        FILE *old = fopen(path, "r");
        char buf[8192];
        size_t got;
        while (old && (got = fread(buf, 1, sizeof buf, old)) > 0) {
            empty = false;
            if (fwrite(buf, 1, got, f) != got) break;
        }
        if (old) fclose(old);
    }
    if (empty && header && fprintf(f, "%s\n", header) < 0) note_write_error(path, errno);
    return f;
}

FILE *csv_open(const char *path, const char *header) {
    return log_rank() == 0 ? out_open(path, header, false) : NULL;
}

FILE *csv_open_append(const char *path, const char *header) {
    return log_rank() == 0 ? out_open(path, header, true) : NULL;
}

void csv_row(FILE *f, const char *fmt, ...) {
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    int rc = vfprintf(f, fmt, ap);
    va_end(ap);
    if (rc < 0 || fputc('\n', f) == EOF || fflush(f) != 0) {
        out_file *o = find_out(f);
        note_write_error(o ? o->path : "a CSV file", errno);
    }
}

int csv_close(FILE *f) {
    if (!f) return 0;
    out_file *o = find_out(f);
    int err = 0;
    if (fflush(f) != 0 || ferror(f)) err = errno ? errno : EIO;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (!o) return err ? -1 : 0;
    if (!err && write_error[0] == 0 && path_is_link(o->path)) err = ELOOP;   /* never renamed over a link */
    else if (!err && write_error[0] == 0 && rename(o->tmp, o->path) != 0) err = errno;
    else if (!err && write_error[0]) err = EIO;   /* an earlier row failed: keep the old file */
    if (err) note_write_error(o->path, err);
    forget_out(o, err != 0);
    return err ? -1 : 0;
}

void csv_abort_all(void) {
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++)
        if (outs[i].f) { fclose(outs[i].f); forget_out(&outs[i], true); }
}

int read_file(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen) {
    *buf = NULL;
    *size = 0;
    /* stat first: a FIFO or a device would block (or never end) in open or read */
    struct stat sb;
    if (stat(path, &sb) != 0) { snprintf(err, errlen, "cannot open: %s", strerror(errno)); return -1; }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "not a regular file (%s)", S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ?
                 "a FIFO" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device" : "a socket or other");
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);   /* (replaced by a FIFO since: no hang) */
    FILE *fp = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!fp) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (fstat(fileno(fp), &sb) != 0) {
        snprintf(err, errlen, "cannot stat: %s", strerror(errno));
        fclose(fp);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "not a regular file");
        fclose(fp);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    size_t n = (size_t)sb.st_size;
    unsigned char *b = malloc(n + 1);
    if (!b) {
        snprintf(err, errlen, "out of memory reading %zu bytes", n);
        fclose(fp);
        return -1;
    }
    size_t got = fread(b, 1, n, fp);
    int read_error = ferror(fp);
    fclose(fp);
    if (got != n) {
        snprintf(err, errlen, "read %zu of %zu bytes%s", got, n, read_error ? " (I/O error)" : " (file changed while reading?)");
        free(b);
        return -1;
    }
    b[n] = 0;
    *buf = b;
    *size = n;
    return 0;
}

/* ---- never through a link (files.h) ---- */

bool path_is_link(const char *path) {
    struct stat st;
    return path && lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

unsigned int temp_random(void) {
    unsigned int r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {   /* (no entropy yet: the clock) */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = (unsigned)ts.tv_nsec ^ (unsigned)ts.tv_sec * 2654435761u;
    }
    static unsigned int calls;
    return r ^ ++calls * 0x9E3779B9u;   /* two calls of one process in one clock tick still differ */
}

char *temp_name_of(const char *path, long pid, unsigned int r) {
    char *t = NULL;
    if (asprintf(&t, "%s.tmp.%ld.%08x", path, pid, r) < 0) return NULL;
    return t;
}

char *temp_name(const char *path) { return temp_name_of(path, (long)getpid(), temp_random()); }

size_t name_without_temp(const char *name) {
    size_t n = strlen(name);
    const char *t = strstr(name, ".tmp");
    if (!t) return n;
    size_t at = (size_t)(t - name);
    if (at + 4 == n) return at;   /* NAME.tmp */
    /* NAME.tmp.<digits>.<8 hex> */
    const char *c = t + 4;
    if (*c++ != '.') return n;
    if (*c < '0' || *c > '9') return n;
    while (*c >= '0' && *c <= '9') c++;
    if (*c++ != '.') return n;
    int hex = 0;
    for (; (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'); c++) hex++;
    return hex == 8 && *c == 0 ? at : n;
}

FILE *create_new_file(const char *path, const char *mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) { int e = errno; close(fd); unlink(path); errno = e; }
    return f;
}

int remove_owned_dir(const char *path, bool (*owned)(const char *name)) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;   /* ELOOP for a link: nothing touched */
    DIR *d = fdopendir(fd);
    if (!d) { int e = errno; close(fd); errno = e; return -1; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && owned(e->d_name))
            unlinkat(dirfd(d), e->d_name, 0);   /* an entry that is a link: the link itself */
    closedir(d);
    return rmdir(path);   /* (rmdir never follows a link either: ENOTDIR) */
}

const char *path_for_message(const char *path, char *buf, size_t len) {
    size_t n = path ? strlen(path) : 0;
    if (n <= 300) snprintf(buf, len, "%s", path ? path : "");
    else snprintf(buf, len, "%.120s...%s (a path of %zu bytes, shown shortened)", path, path + n - 120, n);
    return buf;
}

/* getdents64 through syscall(): the libc directory functions allocate, which a signal handler
 * must not. Entries are removed while listed, so the listing restarts until nothing is left. */
void remove_own_dir_in_handler(int dir_fd, const char *path) {
    static char buf[4096] __attribute__((aligned(8)));
    for (int round = 0; dir_fd >= 0 && round < 64; round++) {
        if (lseek(dir_fd, 0, SEEK_SET) != 0) break;
        long got = syscall(SYS_getdents64, dir_fd, buf, sizeof buf);
        bool removed = false;
        for (long off = 0; got > 0 && off < got;) {
            struct { unsigned long long ino; long long off; unsigned short reclen; unsigned char type; char name[]; }
                *e = (void *)(buf + off);
            if (strcmp(e->name, ".") != 0 && strcmp(e->name, "..") != 0 && unlinkat(dir_fd, e->name, 0) == 0)
                removed = true;
            off += e->reclen;
        }
        if (!removed) break;
    }
    if (path) rmdir(path);
}
