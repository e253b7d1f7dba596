/* ranks: 1 2 */
/* test_output_dir.c: output directories (cli_require_output_dir) and long bad-input messages.
 *
 * Run with no arguments (as the suite does): the paths cli_require_output_dir must accept, on
 * every rank count: a new nested directory (created by rank 0), an existing one, one with a
 * trailing '/', one exactly CLI_MAX_DIR_PATH bytes long.
 *
 * The refusals end the process, so tests/t_output_dir.sh runs them through this program's two
 * other modes and checks exit status 2, one line on stderr, and nothing created:
 *   test_output_dir --require-dir PATH   cli_require_output_dir("--out", PATH), then exit 0
 *   test_output_dir --long-message N     rank 1 (or rank 0 alone) refuses with an N-byte
 *                                        message through comm_require_all; rank 0 must print it
 *                                        whole
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "comm.h"
#include "test_util.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    comm_group *w = comm_init(&argc, &argv);

    if (argc == 3 && strcmp(argv[1], "--require-dir") == 0) {
        cli_require_output_dir("--out", argv[2]);
        comm_finalize();
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--long-message") == 0) {
        int n = atoi(argv[2]);
        char *msg = malloc((size_t)n + 1);
        for (int i = 0; i < n; i++) msg[i] = (char)('a' + i % 26);
        msg[n] = 0;
        memcpy(msg, "BEGIN", 5);
        memcpy(msg + n - 3, "END", 3);
        int bad_rank = w->size > 1 ? 1 : 0;   /* not rank 0: the message must travel */
        comm_require_all(w->rank != bad_rank, "%s", msg);
        free(msg);
        comm_finalize();
        return 0;
    }

    /* the accepting cases, under a fresh directory named after rank 0's pid */
    double pid0 = comm_host_max(w, w->rank == 0 ? (double)getpid() : 0.0);
    char base[64];
    snprintf(base, sizeof base, "/tmp/test_output_dir_%.0f", pid0);
    if (w->rank == 0) {
        nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);   /* a stale one with the same pid */
        CHECK(mkdir(base, 0755) == 0, "cannot create %s", base);
    }

    char p[512];
    snprintf(p, sizeof p, "%s/a/b/c", base);
    cli_require_output_dir("--out", p);
    if (w->rank == 0) CHECK(is_dir(p), "a new nested directory was not created: %s", p);
    cli_require_output_dir("--out", p);   /* again: it exists now */
    snprintf(p, sizeof p, "%s/trailing/", base);
    cli_require_output_dir("--out", p);
    if (w->rank == 0) CHECK(is_dir(p), "a path with a trailing '/'");
    /* exactly CLI_MAX_DIR_PATH bytes: components of 99 bytes */
    int k = snprintf(p, sizeof p, "%s/", base);
    for (int i = k; i < CLI_MAX_DIR_PATH; i++) p[i] = (i - k) % 100 == 99 ? '/' : 'x';
    p[CLI_MAX_DIR_PATH] = 0;
    if (p[CLI_MAX_DIR_PATH - 1] == '/') p[CLI_MAX_DIR_PATH - 1] = 'x';
    cli_require_output_dir("--out", p);
    if (w->rank == 0) CHECK(is_dir(p), "a %d-byte path", CLI_MAX_DIR_PATH);
    /* the write probe leaves nothing */
    if (w->rank == 0) {
        snprintf(p, sizeof p, "%s/a/b/c", base);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", p);
        CHECK(system(cmd) == 0, "the write probe left a file in %s", p);
    }

    if (w->rank == 0) nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    comm_finalize();
    return tu_finish("test_output_dir");
}
