/* Sets of CPU (or NUMA node) numbers and the kernel's list form, "0-3,8,10-11". */
#ifndef DL_CPULIST_H
#define DL_CPULIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* As many CPUs as the kernel's default NR_CPUS on big x86 and arm64 builds. */
#define DL_CPUS_MAX 4096

typedef struct {
    uint64_t bits[DL_CPUS_MAX / 64];
} dl_cpus_t;

static inline void dl_cpus_set(dl_cpus_t *s, int cpu)
{
    s->bits[cpu / 64] |= UINT64_C(1) << (cpu % 64);
}

static inline bool dl_cpus_has(const dl_cpus_t *s, int cpu)
{
    return cpu >= 0 && cpu < DL_CPUS_MAX && (s->bits[cpu / 64] >> (cpu % 64)) & 1;
}

int dl_cpus_count(const dl_cpus_t *s);
/* The lowest member, -1 when empty. */
int dl_cpus_first(const dl_cpus_t *s);
void dl_cpus_and(dl_cpus_t *s, const dl_cpus_t *with);
void dl_cpus_or(dl_cpus_t *s, const dl_cpus_t *with);

/* Parses the kernel's list form (blanks and a trailing newline allowed, "" is the empty set)
 * into *ret. Returns 0, -EINVAL for anything else, -ERANGE for a number >= DL_CPUS_MAX. */
int dl_cpus_parse(const char *text, dl_cpus_t *ret);
/* Writes the list form of s into buf (truncated to len); "" for the empty set. */
void dl_cpus_format(const dl_cpus_t *s, char *buf, size_t len);

#endif
