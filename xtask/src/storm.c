#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* storm getppid|open|open-distinct|badfd N OUT  or  storm badfd-for SECS OUT  or  storm run OUT CMD ARGS... ; writes elapsed ns to OUT */
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
