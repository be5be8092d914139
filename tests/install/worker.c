/* A worker built outside the tree against the installed library: all-reduce of each rank's
 * number, checked against the closed form. */
#include <dlaunch/collective.h>
#include <stdio.h>

int main(void)
{
    dl_coll_group_t *g;
    char err[512];
    double v[4];

    if (dl_coll_group_from_env(&g, err, sizeof(err)) < 0) {
        fprintf(stderr, "worker: %s\n", err);
        return 1;
    }
    int rank = dl_coll_rank(g), n = dl_coll_world_size(g);
    for (int i = 0; i < 4; i++)
        v[i] = rank + 1 + i;
    if (dl_coll_allreduce(g, v, v, 4, DL_COLL_FLOAT64, DL_COLL_SUM) < 0) {
        fprintf(stderr, "worker: %s\n", dl_coll_group_error(g));
        dl_coll_group_destroy(g);
        return 1;
    }
    double want = n * (n + 1) / 2.0 + 3.0 * n;
    printf("rank %d of %d: sum %g (want %g)\n", rank, n, v[3], want);
    dl_coll_group_destroy(g);
    return v[3] == want ? 0 : 1;
}
