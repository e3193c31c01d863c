#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* n IORING_OP_OPENATs of distinct missing paths, one request per
 * io_uring_enter (submit and wait): the io_uring twin of open-distinct */
static int uring_open_distinct(long n) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int fd = syscall(__NR_io_uring_setup, 1, &p);
    if (fd < 0) return 5;
    int prot = PROT_READ | PROT_WRITE, fl = MAP_SHARED | MAP_POPULATE;
    char *sq = mmap(0, p.sq_off.array + p.sq_entries * 4, prot, fl, fd, IORING_OFF_SQ_RING);
    char *cq = mmap(0, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), prot, fl, fd, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqe = mmap(0, sizeof *sqe, prot, fl, fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqe == MAP_FAILED) return 5;
    unsigned *sq_tail = (unsigned *)(sq + p.sq_off.tail), *cq_head = (unsigned *)(cq + p.cq_off.head);
    ((unsigned *)(sq + p.sq_off.array))[0] = 0;
    char path[64];
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/nonexistent/probe-bench/uring-%ld.csv", i);
        memset(sqe, 0, sizeof *sqe);
        sqe->opcode = IORING_OP_OPENAT;
        sqe->fd = AT_FDCWD;
        sqe->addr = (unsigned long)path;
        __atomic_store_n(sq_tail, *sq_tail + 1, __ATOMIC_RELEASE);
        if (syscall(__NR_io_uring_enter, fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return 5;
        __atomic_store_n(cq_head, *cq_head + 1, __ATOMIC_RELEASE);
    }
    return 0;
}

/* storm getppid|open|open-distinct|uring-open-distinct|badfd N OUT  or  storm badfd-for SECS OUT  or  storm run OUT CMD ARGS... ; writes elapsed ns to OUT */
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long long start = now(), elapsed;
    const char *out;
    if (strcmp(argv[1], "run") == 0) {
        out = argv[2];
        start = now();
        pid_t pid = fork();
        if (pid == 0) { execvp(argv[3], argv + 3); _exit(127); }
        int status;
        waitpid(pid, &status, 0);
        elapsed = now() - start;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
    } else {
        long n = atol(argv[2]);
        out = argv[3];
        if (strcmp(argv[1], "getppid") == 0) {
            for (long i = 0; i < n; i++) syscall(SYS_getppid);
        } else if (strcmp(argv[1], "badfd") == 0) {
            for (long i = 0; i < n; i++) close(-1);
        } else if (strcmp(argv[1], "badfd-for") == 0) {
            /* n seconds of close(-1); writes the count instead of the time */
            long long end = start + n * 1000000000LL, count = 0;
            while (now() < end) {
                for (int i = 0; i < 1000; i++) close(-1);
                count += 1000;
            }
            FILE *f = fopen(out, "w");
            if (!f) return 4;
            fprintf(f, "%lld\n", count);
            fclose(f);
            return 0;
        } else if (strcmp(argv[1], "uring-open-distinct") == 0) {
            int r = uring_open_distinct(n);
            if (r) return r;
        } else if (strcmp(argv[1], "open-distinct") == 0) {
            /* a different missing path each time: no two failures alike */
            char path[64];
            for (long i = 0; i < n; i++) {
                snprintf(path, sizeof path, "/nonexistent/probe-bench/missing-%ld.csv", i);
                open(path, O_RDONLY);
            }
        } else {
            for (long i = 0; i < n; i++) open("/nonexistent/probe-bench/missing.csv", O_RDONLY);
        }
        elapsed = now() - start;
    }
    FILE *f = fopen(out, "w");
    if (!f) return 4;
    fprintf(f, "%lld\n", elapsed);
    fclose(f);
    return 0;
}
