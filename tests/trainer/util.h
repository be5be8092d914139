/* Helpers shared by the trainer's tests: scratch folders and generated IDX files. */
#ifndef DL_TEST_TRAINER_UTIL_H
#define DL_TEST_TRAINER_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A fresh folder under $TMPDIR (or /tmp); the caller frees the string and calls tu_rmtree. */
char *tu_tmpdir(void);
void tu_rmtree(const char *dir);

/* Writes an IDX file with the given 4 magic bytes and dimensions, gzip-compressed or plain.
 * data_len may disagree with the dimensions, to make broken files. */
void tu_write_idx(const char *path, bool gz, const uint8_t magic[4], const uint32_t *dims,
                  unsigned ndims, const uint8_t *data, size_t data_len);

/* A learnable toy data set in dir: `classes` classes of side x side images, each a noisy copy of
 * its class's random template, as train-* (n_train samples) and t10k-* (n_test) files. */
void tu_make_dataset(const char *dir, size_t n_train, size_t n_test, size_t side, size_t classes,
                     uint64_t seed);

/* Reads a whole file; the caller frees it. */
uint8_t *tu_read_file(const char *path, size_t *ret_len);
void tu_write_file(const char *path, const void *data, size_t len);

/* The real data set's folder, or NULL when it is not installed. */
const char *tu_fashion_dir(void);

#endif
