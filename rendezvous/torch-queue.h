/* The FIFO queues of torch's newest store protocol (QUEUE_PUSH, QUEUE_POP, QUEUE_LEN): named
 * queues of byte strings, apart from the keys, as torch's libuv server keeps them. A pure data
 * structure: no sockets, no clocks. Capped in items and bytes (names and values together); a
 * queue that a pop empties goes. Internal to the rendezvous layer (torch-store.c). */
#ifndef DL_TORCH_QUEUE_H
#define DL_TORCH_QUEUE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dl__tqueues_s dl__tqueues_t;

/* NULL when out of memory. */
dl__tqueues_t *dl__tqueues_new(size_t max_items, size_t max_bytes);
void dl__tqueues_free(dl__tqueues_t *q); /* accepts NULL */

/* Appends a copy of value to queue name. Returns 0, -ENOSPC when the items or bytes would go
 * over the caps (nothing changed), or -ENOMEM. */
int dl__tqueues_push(dl__tqueues_t *q, const void *name, size_t name_len, const void *value,
                     size_t value_len);

/* Items in queue name (0 for none). */
size_t dl__tqueues_len(const dl__tqueues_t *q, const void *name, size_t name_len);

/* Takes the oldest item of queue name: returns 1 with *ret (malloc'd, the caller frees; NULL
 * for an empty string) and *ret_len, or 0 when the queue is empty. */
int dl__tqueues_pop(dl__tqueues_t *q, const void *name, size_t name_len, uint8_t **ret,
                    size_t *ret_len);

/* Drops every queue (a new round). */
void dl__tqueues_clear(dl__tqueues_t *q);

/* Items and bytes held now. */
void dl__tqueues_usage(const dl__tqueues_t *q, size_t *ret_items, size_t *ret_bytes);

#endif
