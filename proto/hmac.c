/* HMAC-SHA256 from libcrypto, opened with dlopen the first time a MAC is needed: a one-node job
 * computes none, and loading libcrypto (21,000 relocations, 4.7 MB) was the largest part of
 * dlaunch's start-up once libcurl had gone (docs/performance.md, "Launch"). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>

#include <openssl/opensslv.h>

#include "internal.h"

#define STR2(x) #x
#define STR(x) STR2(x)
#if OPENSSL_VERSION_MAJOR >= 3
#define LIBCRYPTO "libcrypto.so." STR(OPENSSL_VERSION_MAJOR)
#else
#define LIBCRYPTO "libcrypto.so.1.1"
#endif

/* The two functions used, with OpenSSL's signatures (their types stay opaque here). */
typedef const void *(*evp_sha256_fn)(void);
typedef unsigned char *(*hmac_fn)(const void *md, const void *key, int key_len,
                                  const unsigned char *data, size_t data_len, unsigned char *md_out,
                                  unsigned int *md_len);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static evp_sha256_fn evp_sha256;
static hmac_fn hmac;

static void load(void)
{
    void *h = dlopen(LIBCRYPTO, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return;
    evp_sha256 = (evp_sha256_fn)dlsym(h, "EVP_sha256");
    hmac = (hmac_fn)dlsym(h, "HMAC");
}

int dl__proto_hmac_raw(const void *key, int key_len, const void *data, size_t data_len,
                       unsigned char *mac, unsigned int *mac_len)
{
    pthread_once(&once, load);
    if (evp_sha256 == NULL || hmac == NULL)
        return -ELIBACC;
    return hmac(evp_sha256(), key, key_len, data, data_len, mac, mac_len) != NULL ? 0 : -EIO;
}
