/* TLS 1.3 record sealing in user space (tlsrec.c), for tls.c only. */
#ifndef BLKD_TLSREC_H
#define BLKD_TLSREC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <openssl/evp.h>

/* The largest record we seal: 16 KiB of content, its inner content type
 * byte, the 16-byte AEAD tag and the 5-byte header. */
#define TLSREC_MAX_CONTENT 16384
#define TLSREC_OVERHEAD    (5 + 1 + 16)
#define TLSREC_MAX_RECORD  (TLSREC_MAX_CONTENT + TLSREC_OVERHEAD)

/* TLS 1.3 record content types. */
#define TLSREC_ALERT       21
#define TLSREC_HANDSHAKE   22
#define TLSREC_APPDATA     23

struct tlsrec;

/* The sending side of a TLS 1.3 session from its traffic secret (the
 * hash of the suite decides its length), sequence number 0.  suite is the
 * IANA number (0x1301 AES-128-GCM, 0x1302 AES-256-GCM, 0x1303
 * ChaCha20-Poly1305).  NULL with errno: ENOTSUP for another suite. */
struct tlsrec *tlsrec_new (unsigned suite, const EVP_MD *md,
                           const uint8_t *secret, size_t secret_len);
void tlsrec_free (struct tlsrec *w);

/* Seal one record of content type TYPE whose content is the pieces in
 * order (at most TLSREC_MAX_CONTENT bytes in all) into out, which has room
 * for len + TLSREC_OVERHEAD.  Returns the record's size, or 0 when the
 * cipher failed (the session cannot go on). */
size_t tlsrec_seal (struct tlsrec *w, uint8_t type, const struct iovec *pieces,
                    int npieces, uint8_t *out);

/* Records sealed under the current key. */
uint64_t tlsrec_records (const struct tlsrec *w);

/* RFC 8446 7.2: after a KeyUpdate is sealed, the next traffic secret, key
 * and IV, sequence back to 0.  -1 when the cipher could not be re-keyed. */
int tlsrec_next_key (struct tlsrec *w);

#endif
