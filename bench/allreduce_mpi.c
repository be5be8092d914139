/* Open MPI's side of bench/allreduce: the same sizes, iterations and timing as our worker, with
 * MPI_Allreduce (float32, sum, out of place). Started by the driver through mpirun. */
#include <mpi.h>

#include "allreduce_common.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    bench_args_t a = {4096, 256 << 20, 4, 2e9, NULL, "mpi", "?"};
    if (bench_parse(&a, argc, argv, 1) < 0) {
        if (rank == 0)
            fprintf(stderr, "allreduce-mpi: bad arguments\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* Buffers allocated and touched once, like ours: a fair fight. For shm-reg both come from
     * MPI_Alloc_mem, MPI's counterpart of dl_coll_mem_alloc. */
    int reg = strcmp(a.transport, "shm-reg") == 0;
    float *src = NULL, *dst = NULL;
    if (reg) {
        if (MPI_Alloc_mem((MPI_Aint)a.max_bytes, MPI_INFO_NULL, &src) != MPI_SUCCESS)
            src = NULL;
        if (MPI_Alloc_mem((MPI_Aint)a.max_bytes, MPI_INFO_NULL, &dst) != MPI_SUCCESS)
            dst = NULL;
    } else {
        src = malloc(a.max_bytes);
        dst = malloc(a.max_bytes);
    }
    if (src == NULL || dst == NULL)
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (size_t i = 0; i < a.max_bytes / sizeof(float); i++)
        src[i] = dst[i] = (float)(i % 1000) * 0.001f;
    FILE *out = rank == 0 ? fopen(a.out, "a") : NULL;
    for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= (size_t)a.step) {
        int count = (int)(bytes / sizeof(float)), iters = bench_iters(&a, bytes);
        for (int i = 0; i < 2; i++)
            MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double tmax = 0;
        for (int b = 0; b < BENCH_BATCHES; b++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t = (MPI_Wtime() - t0) / iters, tm = 0;
            MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (b == 0 || tm < tmax)
                tmax = tm;
        }
        if (out != NULL) {
            bench_row(out, &a, world, bytes, tmax);
            fflush(out);
        }
    }
    if (out != NULL)
        fclose(out);
    if (reg) {
        MPI_Free_mem(src);
        MPI_Free_mem(dst);
    } else {
        free(src);
        free(dst);
    }
    MPI_Finalize();
    return 0;
}
