/* The reference of `cargo xtask bench distribute`: Open MPI's own MPI_Allreduce (MPI_SUM of
 * floats), timed as distribute/examples/collective_bench.rs times ours: WARM_UP calls, then
 * REPEATS calls each after a barrier; rank 0 prints `allreduce BYTES SECONDS` (the median).
 * Usage: mpi_allreduce MB,MB,.. REPEATS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Untimed calls per size first (as OSU's benchmarks skip their first iterations): the first
 * calls of a size in a process pay for first-touch page faults and transport setup (ours, over
 * MPI: the first 5-7 calls of 4 MB took twice the later ones). */
#define WARM_UP 10

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc != 3) {
        if (rank == 0) fprintf(stderr, "usage: mpi_allreduce MB,MB,.. REPEATS\n");
        MPI_Finalize();
        return 2;
    }
    int repeats = atoi(argv[2]);
    double *times = malloc(sizeof(double) * (repeats > 0 ? repeats : 1));
    char *sizes = strdup(argv[1]);
    for (char *mb = strtok(sizes, ","); mb; mb = strtok(NULL, ",")) {
        size_t n = (size_t)(atof(mb) * (1 << 20) / 4.0);
        float *send = malloc(n * sizeof(float)), *recv = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) send[i] = (float)((i * 2654435761u) % 1000) * 1e-3f;
        for (int w = 0; w < WARM_UP; w++)
            MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int r = 0; r < repeats; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            times[r] = MPI_Wtime() - t;
        }
        qsort(times, repeats, sizeof(double), cmp);
        if (rank == 0) printf("allreduce %zu %.6e\n", n * 4, times[repeats / 2]);
        fflush(stdout);
        free(send);
        free(recv);
    }
    free(sizes);
    free(times);
    MPI_Finalize();
    return 0;
}
