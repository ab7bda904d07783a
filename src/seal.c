/* seal.c — see seal.h. */
#include "seal.h"

#include <stdint.h>
#include <string.h>

#include <sodium.h>

/* The KDF's context: eight bytes naming what its keys are for. */
static const char seal_context[crypto_kdf_CONTEXTBYTES] = {'i', 's', 't', 'h', 'l', 'i', 'n', 'k'};
/* Sites per side of the pair index: config.h's CONFIG_MAX_SITES is smaller. */
#define SEAL_MAX_SITES 65536

int seal_init(void) { return sodium_init() < 0 ? -1 : 0; }

void seal_random(void *buf, size_t n) { randombytes_buf(buf, n); }

void seal_wipe(void *buf, size_t n) { sodium_memzero(buf, n); }

unsigned long long seal_fingerprint(const unsigned char master[SEAL_KEY_BYTES])
{
    static const unsigned char label[] = "isthmus link key fingerprint v1";
    unsigned char h[8];
    crypto_generichash(h, sizeof h, label, sizeof label, master, SEAL_KEY_BYTES);
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | h[i];
    return v;
}

void seal_master(unsigned char master[SEAL_KEY_BYTES], const unsigned char run_key[SEAL_KEY_BYTES],
                 const char *run_id, const unsigned char epoch[SEAL_EPOCH_BYTES])
{
    static const unsigned char label[] = "isthmus link keys v1";
    const unsigned char zero = 0; /* ends the run id: no two (id, epoch) pairs hash alike */
    crypto_generichash_state st;
    crypto_generichash_init(&st, run_key, SEAL_KEY_BYTES, SEAL_KEY_BYTES);
    crypto_generichash_update(&st, label, sizeof label);
    crypto_generichash_update(&st, (const unsigned char *)run_id, strlen(run_id));
    crypto_generichash_update(&st, &zero, 1);
    crypto_generichash_update(&st, epoch, SEAL_EPOCH_BYTES);
    crypto_generichash_final(&st, master, SEAL_KEY_BYTES);
}

void seal_pair_key(unsigned char key[SEAL_KEY_BYTES], const unsigned char master[SEAL_KEY_BYTES], int from, int to)
{
    const uint64_t id = (uint64_t)from * SEAL_MAX_SITES + (uint64_t)to;
    crypto_kdf_derive_from_key(key, SEAL_KEY_BYTES, id, seal_context, master);
}

void seal_frame(const unsigned char key[SEAL_KEY_BYTES], int encrypt, unsigned char nonce[SEAL_NONCE_BYTES],
                unsigned char tag[SEAL_TAG_BYTES], const unsigned char *ad, size_t ad_len, unsigned char *payload,
                size_t n)
{
    randombytes_buf(nonce, SEAL_NONCE_BYTES);
    unsigned long long tag_len;
    unsigned char none[1] = {0}; /* the empty message's buffers (libsodium wants pointers) */
    if (encrypt)
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(payload, tag, &tag_len, payload, n, ad, ad_len, NULL,
                                                            nonce, key);
    else
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(none, tag, &tag_len, none, 0, ad, ad_len + n, NULL,
                                                            nonce, key);
}

int seal_open(const unsigned char key[SEAL_KEY_BYTES], int encrypt, const unsigned char nonce[SEAL_NONCE_BYTES],
              const unsigned char tag[SEAL_TAG_BYTES], const unsigned char *ad, size_t ad_len, unsigned char *payload,
              size_t n)
{
    unsigned char none[1] = {0};
    if (encrypt)
        return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, n, tag, ad, ad_len, nonce,
                                                                   key) == 0 ? 0 : -1;
    return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(none, NULL, none, 0, tag, ad, ad_len + n, nonce,
                                                               key) == 0 ? 0 : -1;
}
