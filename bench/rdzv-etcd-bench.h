/* bench/rdzv --etcd (rdzv-etcd.c): the etcd row beside our own server's. */
#ifndef DL_BENCH_RDZV_ETCD_H
#define DL_BENCH_RDZV_ETCD_H

/* Starts a 3-member etcd cluster on loopback; returns its endpoints, or NULL having said why. */
const char *dl_bench_etcd_start(void);
/* n agents join one job through it; prints the row. Returns 0 or -1. */
int dl_bench_etcd_run(int n, int json);
void dl_bench_etcd_stop(void);

#endif
