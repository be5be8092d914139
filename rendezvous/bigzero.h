/* Zeroed memory for a struct that holds a large read buffer (the rendezvous server's, the torch
 * store's: 64 KB each). Mapped rather than calloc'd: calloc clears, and so faults in, every page,
 * while a mapping's pages cost nothing until first used, and a job whose workers never read or
 * write the store uses none of the buffer's. */
#ifndef DL_RDZV_BIGZERO_H
#define DL_RDZV_BIGZERO_H

#include <stddef.h>
#include <sys/mman.h>

static inline void *dl__bigzero_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p != MAP_FAILED ? p : NULL;
}

static inline void dl__bigzero_free(void *p, size_t size)
{
    if (p != NULL)
        munmap(p, size);
}

#endif
