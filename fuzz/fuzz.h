/* What every fuzz target shares: its entry point, and the check that turns a broken rule into a
 * crash the fuzzer (or the replay in the ordinary build, fuzz/replay.c) reports. */
#ifndef DL_FUZZ_H
#define DL_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Names the rule before aborting, so a crash report says which one broke. */
#define DL_FUZZ_REQUIRE(cond)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: broken rule: %s\n", __FILE__, __LINE__, #cond);                \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
