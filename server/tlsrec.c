/* TLS 1.3 record sealing in user space: the send direction of a session
 * after OpenSSL finished the handshake (RFC 8446 5.2, 5.3, 7.1, 7.2).
 *
 * Why not SSL_write: OpenSSL 3.0 copies every plaintext byte into its own
 * record buffer before sealing it there, and writes each 16 KiB record with
 * a write(2) of its own.  Sealing here reads the plaintext where it lies
 * (the pool buffer of a reply, gathered with its header) and writes the
 * ciphertext into a buffer tls.c sends several records at a time: what
 * kernel TLS does, done in user space when the kernel has no tls module.
 *
 * What this file owns is the key schedule of one direction and the record
 * format; it never sees a socket.  Limits: TLS 1.3 only (TLS 1.2 sessions
 * stay with SSL_write), and only the three AEAD suites blkd offers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "tlsrec.h"

#define TAG_LEN   16
#define IV_LEN    12

struct tlsrec {
  EVP_CIPHER_CTX *ctx;
  const EVP_CIPHER *cipher;
  const EVP_MD *md;
  size_t key_len;
  uint8_t secret[EVP_MAX_MD_SIZE];  /* current traffic secret */
  size_t secret_len;
  uint8_t iv[IV_LEN];
  uint64_t seq;                     /* records sealed under this key */
};

/* HKDF-Expand-Label (RFC 8446 7.1) with an empty context, for outputs no
 * longer than the hash: a single HMAC block, T(1) = HMAC(secret, info|1). */
static int
expand_label (const EVP_MD *md, const uint8_t *secret, size_t secret_len,
              const char *label, uint8_t *out, size_t out_len)
{
  uint8_t info[2 + 1 + 255 + 1 + 1];
  size_t label_len = 6 + strlen (label);   /* "tls13 " + label */
  size_t n = 0;
  uint8_t block[EVP_MAX_MD_SIZE];
  unsigned block_len = 0;

  if (out_len > (size_t) EVP_MD_get_size (md) || label_len > 255) {
    errno = EINVAL;
    return -1;
  }
  info[n++] = out_len >> 8;
  info[n++] = out_len & 0xff;
  info[n++] = label_len;
  memcpy (info + n, "tls13 ", 6);
  memcpy (info + n + 6, label, label_len - 6);
  n += label_len;
  info[n++] = 0;                            /* context: empty */
  info[n++] = 1;                            /* HKDF-Expand's counter */
  if (!HMAC (md, secret, secret_len, info, n, block, &block_len)
      || block_len < out_len) {
    errno = EPROTO;
    return -1;
  }
  memcpy (out, block, out_len);
  OPENSSL_cleanse (block, sizeof block);
  return 0;
}

/* Key and IV from the current secret; sequence back to 0. */
static int
install_key (struct tlsrec *w)
{
  uint8_t key[32];
  int r = -1;

  if (expand_label (w->md, w->secret, w->secret_len, "key", key, w->key_len) == -1
      || expand_label (w->md, w->secret, w->secret_len, "iv", w->iv, IV_LEN) == -1)
    goto out;
  if (EVP_EncryptInit_ex (w->ctx, w->cipher, NULL, key, NULL) != 1) {
    errno = EPROTO;
    goto out;
  }
  w->seq = 0;
  r = 0;
out:
  OPENSSL_cleanse (key, sizeof key);
  return r;
}

struct tlsrec *
tlsrec_new (unsigned suite, const EVP_MD *md, const uint8_t *secret, size_t secret_len)
{
  struct tlsrec *w;
  const EVP_CIPHER *cipher;
  size_t key_len;

  switch (suite) {
  case 0x1301: cipher = EVP_aes_128_gcm (); key_len = 16; break;
  case 0x1302: cipher = EVP_aes_256_gcm (); key_len = 32; break;
  case 0x1303: cipher = EVP_chacha20_poly1305 (); key_len = 32; break;
  default:
    errno = ENOTSUP;
    return NULL;
  }
  if (!md || secret_len != (size_t) EVP_MD_get_size (md) || secret_len > EVP_MAX_MD_SIZE) {
    errno = EINVAL;
    return NULL;
  }
  w = calloc (1, sizeof *w);
  if (!w)
    return NULL;
  w->ctx = EVP_CIPHER_CTX_new ();
  if (!w->ctx) {
    errno = ENOMEM;
    goto fail;
  }
  w->cipher = cipher;
  w->md = md;
  w->key_len = key_len;
  memcpy (w->secret, secret, secret_len);
  w->secret_len = secret_len;
  if (install_key (w) == -1)
    goto fail;
  return w;

fail:
  tlsrec_free (w);
  return NULL;
}

void
tlsrec_free (struct tlsrec *w)
{
  if (!w)
    return;
  EVP_CIPHER_CTX_free (w->ctx);
  OPENSSL_cleanse (w, sizeof *w);
  free (w);
}

uint64_t
tlsrec_records (const struct tlsrec *w)
{
  return w->seq;
}

int
tlsrec_next_key (struct tlsrec *w)
{
  uint8_t next[EVP_MAX_MD_SIZE];
  if (expand_label (w->md, w->secret, w->secret_len, "traffic upd", next, w->secret_len) == -1)
    return -1;
  memcpy (w->secret, next, w->secret_len);
  OPENSSL_cleanse (next, sizeof next);
  return install_key (w);
}

size_t
tlsrec_seal (struct tlsrec *w, uint8_t type, const struct iovec *pieces, int npieces,
             uint8_t *out)
{
  size_t len = 0;
  for (int i = 0; i < npieces; i++)
    len += pieces[i].iov_len;
  if (len > TLSREC_MAX_CONTENT)
    return 0;

  /* Header (also the AEAD's additional data): opaque_type application_data,
   * legacy version 3.3, length of what follows (content, type, tag). */
  size_t body = len + 1 + TAG_LEN;
  out[0] = TLSREC_APPDATA;
  out[1] = 3;
  out[2] = 3;
  out[3] = body >> 8;
  out[4] = body & 0xff;

  /* Nonce: the IV with the 64-bit sequence number XORed into its end. */
  uint8_t nonce[IV_LEN];
  memcpy (nonce, w->iv, IV_LEN);
  for (int i = 0; i < 8; i++)
    nonce[IV_LEN - 1 - i] ^= (uint8_t) (w->seq >> (8 * i));

  int outl;
  uint8_t *p = out + 5;
  if (EVP_EncryptInit_ex (w->ctx, NULL, NULL, NULL, nonce) != 1
      || EVP_EncryptUpdate (w->ctx, NULL, &outl, out, 5) != 1)
    return 0;
  for (int i = 0; i < npieces; i++) {
    if (pieces[i].iov_len == 0)
      continue;
    if (EVP_EncryptUpdate (w->ctx, p, &outl, pieces[i].iov_base, pieces[i].iov_len) != 1)
      return 0;
    p += outl;
  }
  if (EVP_EncryptUpdate (w->ctx, p, &outl, &type, 1) != 1)
    return 0;
  p += outl;
  if (EVP_EncryptFinal_ex (w->ctx, p, &outl) != 1)
    return 0;
  p += outl;
  if (p != out + 5 + len + 1
      || EVP_CIPHER_CTX_ctrl (w->ctx, EVP_CTRL_AEAD_GET_TAG, TAG_LEN, p) != 1)
    return 0;
  w->seq++;
  return 5 + body;
}
