/* Handshake: fixed newstyle negotiation, option haggling and opening the
 * export, all driven by whatever bytes have arrived in the connection. */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "internal.h"

/* Largest option payload we buffer: a 4096-byte name plus INFO/GO's or
 * META_CONTEXT's framing and a generous query list.  Longer options are
 * read and thrown away, then answered with ERR_TOO_BIG, keeping sync. */
#define MAX_OPTION_LEN (NBD_MAX_STRING * 4 + 64)
#define META_CONTEXT_ID_BASE_ALLOCATION 1

static inline uint16_t rd16 (const uint8_t *p) { uint16_t v; memcpy (&v, p, 2); return be16toh (v); }
static inline uint32_t rd32 (const uint8_t *p) { uint32_t v; memcpy (&v, p, 4); return be32toh (v); }
static inline uint64_t rd64 (const uint8_t *p) { uint64_t v; memcpy (&v, p, 8); return be64toh (v); }

static int
send_option_reply (struct conn *c, uint32_t option, uint32_t reply,
                   const void *data, uint32_t len)
{
  struct nbd_option_reply h = {
    .magic = htobe64 (NBD_REP_MAGIC), .option = htobe32 (option),
    .reply = htobe32 (reply), .length = htobe32 (len),
  };
  if (outbuf_append (&c->out, &h, sizeof h) == -1
      || (len && outbuf_append (&c->out, data, len) == -1))
    return -1;
  return 0;
}

static int
send_error (struct conn *c, uint32_t option, uint32_t reply, const char *msg)
{
  log_debug ("option %u refused (0x%x): %s", option, reply, msg);
  return send_option_reply (c, option, reply, msg, strlen (msg));
}

/* The global flags we offer, less those --mask-handshake turned off. */
static uint16_t
handshake_gflags (void)
{
  return (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES) & ~cfg.gflags_masked;
}

void
handshake_start (struct conn *c)
{
  uint8_t g[18];
  uint64_t m1 = htobe64 (NBD_MAGIC), m2 = htobe64 (NBD_OPTS_MAGIC);
  uint16_t flags = htobe16 (handshake_gflags ());
  memcpy (g, &m1, 8);
  memcpy (g + 8, &m2, 8);
  memcpy (g + 16, &flags, 2);
  c->phase = CONN_HS_CLIENT_FLAGS;
  if (outbuf_append (&c->out, g, sizeof g) == -1)
    c->read_block |= CONN_READ_CLOSING;
}

/* The transmission flags for the open export. */
uint16_t
handshake_export_flags (struct conn *c)
{
  const struct backend_caps *k = &c->pc.caps;
  uint16_t f = NBD_FLAG_HAS_FLAGS;
  bool writable = k->can_write && !cfg.readonly;

  if (!writable)
    f |= NBD_FLAG_READ_ONLY;
  if (k->can_flush)
    f |= NBD_FLAG_SEND_FLUSH;
  if (writable && k->can_fua != NBDKIT_FUA_NONE)
    f |= NBD_FLAG_SEND_FUA;
  if (k->is_rotational)
    f |= NBD_FLAG_ROTATIONAL;
  if (writable && k->can_trim)
    f |= NBD_FLAG_SEND_TRIM;
  if (writable && k->can_zero > 0 /* not NBDKIT_ZERO_NONE */)
    f |= NBD_FLAG_SEND_WRITE_ZEROES;
  if (writable && k->can_fast_zero)
    f |= NBD_FLAG_SEND_FAST_ZERO;
  if (c->structured)
    f |= NBD_FLAG_SEND_DF;
  if (k->can_multi_conn)
    f |= NBD_FLAG_CAN_MULTI_CONN;
  if (k->can_cache != NBDKIT_CACHE_NONE)
    f |= NBD_FLAG_SEND_CACHE;
  return f;
}

/* The block size constraints we advertise (and enforce in protocol.c). */
void
handshake_block_sizes (struct conn *c, uint32_t *min, uint32_t *pref, uint32_t *max)
{
  const struct backend_caps *k = &c->pc.caps;
  if (k->block_min) {
    *min = k->block_min;
    *pref = k->block_pref;
    *max = k->block_max;
  }
  else {
    *min = 1;
    *pref = 4096;
    *max = 0xffffffff;
  }
  /* Our own ceiling on payloads; keep it a multiple of the minimum. */
  if (*max > cfg.max_request)
    *max = cfg.max_request - cfg.max_request % *min;
  if (*pref > *max)
    *pref = *max;
}

/* Resolve "" to the default export and open it for this connection. */
static int
open_export (struct conn *c, const char *name, size_t len)
{
  char *n = strndup (name, len);
  if (!n)
    return -1;
  if (len == 0) {
    const char *d = backend_conn_default_export (&c->pc, cfg.readonly);
    if (d) {
      free (n);
      n = strdup (d);
      if (!n)
        return -1;
    }
  }
  free (c->export_name);
  c->export_name = n;
  if (backend_conn_open (&c->pc, c->export_name, cfg.readonly) == -1)
    return -1;
  log_debug ("export \"%s\" open: size %lld", c->export_name,
             (long long) c->pc.caps.size);
  return 0;
}

static int
send_info (struct conn *c, uint32_t option, uint16_t type, const void *data, size_t len)
{
  uint8_t buf[2 + NBD_MAX_STRING + 16];
  uint16_t t = htobe16 (type);
  if (len > sizeof buf - 2)
    len = sizeof buf - 2;
  memcpy (buf, &t, 2);
  memcpy (buf + 2, data, len);
  return send_option_reply (c, option, NBD_REP_INFO, buf, 2 + len);
}

/* INFO/GO: check the option and set the open up for handshake_call. */
static int
opt_info_go (struct conn *c, uint32_t option, const uint8_t *d, uint32_t len)
{
  if (len < 6)
    return send_error (c, option, NBD_REP_ERR_INVALID, "option too short");
  uint32_t namelen = rd32 (d);
  if (namelen > NBD_MAX_STRING || (uint64_t) namelen + 6 > len)
    return send_error (c, option, NBD_REP_ERR_INVALID, "bad export name length");
  const char *name = (const char *) d + 4;
  uint16_t nreq = rd16 (d + 4 + namelen);
  if ((uint64_t) 4 + namelen + 2 + 2 * (uint64_t) nreq != len)
    return send_error (c, option, NBD_REP_ERR_INVALID, "bad information request count");
  if (memchr (name, '\0', namelen))
    return send_error (c, option, NBD_REP_ERR_INVALID, "export name contains NUL");
  if (cfg.ext_headers == EXT_HEADERS_REQUIRE && !c->extended)
    return send_error (c, option, NBD_REP_ERR_EXT_HEADER_REQD,
                       "this server requires extended headers");

  struct handshake_call *k = &c->hs;
  k->want_name = k->want_desc = false;
  for (uint16_t i = 0; i < nreq; i++) {
    uint16_t t = rd16 (d + 4 + namelen + 2 + 2 * i);
    k->want_name |= t == NBD_INFO_NAME;
    k->want_desc |= t == NBD_INFO_DESCRIPTION;
  }
  if (!(k->name = strndup (name, namelen)))
    return -1;
  k->option = option;
  return HANDSHAKE_CALL;
}

/* INFO/GO's plugin calls (worker or shard thread): open the export, ask
 * for its description; INFO closes it again (the caps stay in c->pc for
 * the reply). */
static void
call_info_go (struct conn *c, struct handshake_call *k)
{
  backend_conn_close (&c->pc);      /* an earlier INFO's handle, if any */
  k->result = open_export (c, k->name, strlen (k->name));
  if (k->result == 0 && k->want_desc) {
    const char *desc = backend_conn_export_description (&c->pc);
    if (desc && !(k->desc = strndup (desc, NBD_MAX_STRING)))
      k->result = -1;
  }
  if (k->option == NBD_OPT_INFO || k->result == -1)
    backend_conn_close (&c->pc);
}

/* INFO/GO's replies, on the shard thread. */
static int
done_info_go (struct conn *c, struct handshake_call *k)
{
  uint32_t option = k->option;
  if (k->result == -1)
    return send_error (c, option, NBD_REP_ERR_UNKNOWN, "export not available");

  uint8_t exp[10];
  uint64_t size = htobe64 ((uint64_t) c->pc.caps.size);
  uint16_t flags = htobe16 (handshake_export_flags (c));
  memcpy (exp, &size, 8);
  memcpy (exp + 8, &flags, 2);
  if (send_info (c, option, NBD_INFO_EXPORT, exp, sizeof exp) == -1)
    return -1;
  if (k->want_name && send_info (c, option, NBD_INFO_NAME, c->export_name,
                                 strlen (c->export_name)) == -1)
    return -1;
  if (k->desc && send_info (c, option, NBD_INFO_DESCRIPTION, k->desc, strlen (k->desc)) == -1)
    return -1;
  /* Always sent: a client that did not ask may ignore it (proto.md). */
  uint32_t bs[3];
  handshake_block_sizes (c, &bs[0], &bs[1], &bs[2]);
  for (int i = 0; i < 3; i++)
    bs[i] = htobe32 (bs[i]);
  if (send_info (c, option, NBD_INFO_BLOCK_SIZE, bs, sizeof bs) == -1)
    return -1;
  if (send_option_reply (c, option, NBD_REP_ACK, NULL, 0) == -1)
    return -1;

  if (option == NBD_OPT_GO) {
    c->phase = CONN_TRANSMISSION;
    log_debug ("transmission phase: export \"%s\"%s", c->export_name,
               c->extended ? ", extended headers"
               : c->structured ? ", structured replies" : "");
  }
  return 0;
}

static int
opt_export_name (struct conn *c, const uint8_t *d, uint32_t len)
{
  if (len > NBD_MAX_STRING || memchr (d, '\0', len)) {
    log_error ("EXPORT_NAME: bad export name; closing");
    return -1;
  }
  /* EXPORT_NAME has no way to say no: failure closes the connection.
   * Its reply has no room for extended headers, so a client that took
   * them may not use it (proto.md). */
  if (c->extended || cfg.ext_headers == EXT_HEADERS_REQUIRE) {
    log_error ("EXPORT_NAME %s; closing", c->extended ? "after extended headers"
               : "but this server requires extended headers");
    return -1;
  }
  if (!(c->hs.name = strndup ((const char *) d, len)))
    return -1;
  c->hs.option = NBD_OPT_EXPORT_NAME;
  return HANDSHAKE_CALL;
}

static int
done_export_name (struct conn *c, struct handshake_call *k)
{
  if (k->result == -1)
    return -1;
  uint8_t r[10 + 124];
  uint64_t size = htobe64 ((uint64_t) c->pc.caps.size);
  uint16_t flags = htobe16 (handshake_export_flags (c));
  memcpy (r, &size, 8);
  memcpy (r + 8, &flags, 2);
  memset (r + 10, 0, 124);
  if (outbuf_append (&c->out, r, c->no_zeroes ? 10 : sizeof r) == -1)
    return -1;
  c->phase = CONN_TRANSMISSION;
  return 0;
}

static int
opt_list (struct conn *c, uint32_t len)
{
  if (len != 0)
    return send_error (c, NBD_OPT_LIST, NBD_REP_ERR_INVALID, "LIST takes no data");
  c->hs.option = NBD_OPT_LIST;
  return HANDSHAKE_CALL;
}

/* LIST's plugin calls: the list, and the default export's name if the
 * list asks for it. */
static void
call_list (struct conn *c, struct handshake_call *k)
{
  k->exports = backend_conn_list_exports (&c->pc, cfg.readonly);
  if (!k->exports || !k->exports->use_default || cfg.export_name)
    return;
  const char *def = backend_conn_default_export (&c->pc, cfg.readonly);
  if (def && !(k->list_default = strdup (def))) {
    public_exports_free (k->exports);
    k->exports = NULL;
  }
}

static int
done_list (struct conn *c, struct handshake_call *k)
{
  struct nbdkit_exports *e = k->exports;
  if (!e)
    return send_error (c, NBD_OPT_LIST, NBD_REP_ERR_PLATFORM, "cannot list exports");

  int r = 0;
  if (e->use_default) {
    const char *def = cfg.export_name ? cfg.export_name : k->list_default;
    if (nbdkit_add_export (e, def ? def : "", NULL) == -1)
      r = -1;
  }
  for (size_t i = 0; r == 0 && i < e->len; i++) {
    const char *name = e->v[i].name, *desc = e->v[i].description;
    size_t nl = strnlen (name, NBD_MAX_STRING), dl = desc ? strnlen (desc, NBD_MAX_STRING) : 0;
    uint8_t *buf = malloc (4 + nl + dl);
    if (!buf) {
      r = -1;
      break;
    }
    uint32_t be = htobe32 (nl);
    memcpy (buf, &be, 4);
    memcpy (buf + 4, name, nl);
    if (dl)
      memcpy (buf + 4 + nl, desc, dl);
    r = send_option_reply (c, NBD_OPT_LIST, NBD_REP_SERVER, buf, 4 + nl + dl);
    free (buf);
  }
  if (r == 0)
    r = send_option_reply (c, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
  return r;
}

void
handshake_call (struct conn *c)
{
  struct handshake_call *k = &c->hs;
  if (k->option == NBD_OPT_LIST)
    call_list (c, k);
  else if (k->option == NBD_OPT_EXPORT_NAME)
    k->result = open_export (c, k->name, strlen (k->name));
  else
    call_info_go (c, k);
}

void
handshake_call_discard (struct conn *c)
{
  struct handshake_call *k = &c->hs;
  free (k->name);
  free (k->desc);
  free (k->list_default);
  if (k->exports)
    public_exports_free (k->exports);
  memset (k, 0, sizeof *k);
}

int
handshake_call_done (struct conn *c)
{
  struct handshake_call *k = &c->hs;
  int r;
  if (k->option == NBD_OPT_LIST)
    r = done_list (c, k);
  else if (k->option == NBD_OPT_EXPORT_NAME)
    r = done_export_name (c, k);
  else
    r = done_info_go (c, k);
  handshake_call_discard (c);
  return r;
}

/* LIST/SET_META_CONTEXT: we know one context, base:allocation. */
static int
opt_meta_context (struct conn *c, uint32_t option, const uint8_t *d, uint32_t len)
{
  if (!c->structured)
    return send_error (c, option, NBD_REP_ERR_INVALID,
                       "structured replies must be negotiated first");
  if (len < 8)
    return send_error (c, option, NBD_REP_ERR_INVALID, "option too short");
  uint32_t namelen = rd32 (d);
  if (namelen > NBD_MAX_STRING || (uint64_t) namelen + 8 > len)
    return send_error (c, option, NBD_REP_ERR_INVALID, "bad export name length");
  uint32_t nq = rd32 (d + 4 + namelen);
  const uint8_t *q = d + 8 + namelen, *end = d + len;

  /* Validate the whole list before answering any of it. */
  const uint8_t *s = q;
  for (uint32_t i = 0; i < nq; i++) {
    if (end - s < 4 || rd32 (s) > (uint64_t) (end - s - 4))
      return send_error (c, option, NBD_REP_ERR_INVALID, "bad query length");
    s += 4 + rd32 (s);
  }
  if (s != end)
    return send_error (c, option, NBD_REP_ERR_INVALID, "trailing bytes after queries");

  static const char ctx_name[] = "base:allocation";
  bool match = false;
  if (nq == 0)
    match = option == NBD_OPT_LIST_META_CONTEXT;   /* list: everything */
  for (uint32_t i = 0; i < nq; i++) {
    uint32_t ql = rd32 (q);
    const char *qs = (const char *) q + 4;
    if ((ql == sizeof ctx_name - 1 && memcmp (qs, ctx_name, ql) == 0)
        || (option == NBD_OPT_LIST_META_CONTEXT && ql == 5 && memcmp (qs, "base:", 5) == 0))
      match = true;
    q += 4 + ql;
  }
  if (option == NBD_OPT_SET_META_CONTEXT)
    c->meta_base_allocation = match;
  if (match) {
    uint8_t buf[4 + sizeof ctx_name - 1];
    uint32_t id = htobe32 (META_CONTEXT_ID_BASE_ALLOCATION);
    memcpy (buf, &id, 4);
    memcpy (buf + 4, ctx_name, sizeof ctx_name - 1);
    if (send_option_reply (c, option, NBD_REP_META_CONTEXT, buf, sizeof buf) == -1)
      return -1;
  }
  return send_option_reply (c, option, NBD_REP_ACK, NULL, 0);
}

/* STARTTLS: ACK in clear, then TLS (conn.c switches once the ACK is out).
 * Nothing negotiated in clear may survive into the TLS session, and any
 * bytes the client sent behind STARTTLS are dropped unread: a client that
 * does not wait for the ACK, or an attacker injecting options ahead of the
 * handshake, gets nothing parsed (nbdkit's CVE-2021-3716). */
static int
opt_starttls (struct conn *c, uint32_t len)
{
  if (len != 0)
    return send_error (c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, "STARTTLS takes no data");
  if (cfg.tls == TLS_OFF)
    return send_error (c, NBD_OPT_STARTTLS, NBD_REP_ERR_POLICY,
                       "TLS is not configured on this server");
  if (c->tls)
    return send_error (c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, "TLS is already up");

  c->structured = false;
  c->extended = false;
  c->meta_base_allocation = false;
  backend_conn_close (&c->pc);
  free (c->export_name);
  c->export_name = NULL;
  c->pc.ctx.export_name = NULL;
  if (c->rlen > c->roff)
    log_warn ("discarding %zu bytes sent in clear after STARTTLS", c->rlen - c->roff);
  c->roff = c->rlen = 0;

  if (send_option_reply (c, NBD_OPT_STARTTLS, NBD_REP_ACK, NULL, 0) == -1
      || tls_start (c) == -1)
    return -1;
  c->read_block |= CONN_READ_STARTTLS;
  c->phase = CONN_TLS_HANDSHAKE;
  return 0;
}

/* EXTENDED_HEADERS: 32-byte requests and replies from the transmission
 * phase on.  They carry structured replies with them, so a
 * SET_META_CONTEXT sent next is accepted too. */
static int
opt_extended_headers (struct conn *c, uint32_t len)
{
  if (len != 0)
    return send_error (c, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_INVALID,
                       "EXTENDED_HEADERS takes no data");
  if (cfg.ext_headers == EXT_HEADERS_OFF || cfg.no_sr)
    return send_error (c, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ERR_UNSUP,
                       cfg.no_sr ? "structured replies are off (--no-sr)"
                       : "extended headers are off (--ext-headers=off)");
  c->extended = true;
  c->structured = true;
  return send_option_reply (c, NBD_OPT_EXTENDED_HEADERS, NBD_REP_ACK, NULL, 0);
}

static int
handle_option (struct conn *c, uint32_t option, const uint8_t *d, uint32_t len)
{
  log_debug ("option %u, %u bytes", option, len);
  /* A client that did not take fixed newstyle (--mask-handshake can
   * withhold it) may only send EXPORT_NAME; the others get ERR_INVALID,
   * as nbdkit answers them. */
  if (!c->fixed_newstyle && option != NBD_OPT_EXPORT_NAME)
    return send_error (c, option, NBD_REP_ERR_INVALID,
                       "only EXPORT_NAME without fixed newstyle");
  /* --tls=require: nothing but STARTTLS and ABORT in clear, so no export
   * (not even its name or size) is reachable without TLS. */
  if (cfg.tls == TLS_REQUIRE && !c->tls && option != NBD_OPT_STARTTLS
      && option != NBD_OPT_ABORT) {
    if (option == NBD_OPT_EXPORT_NAME) {
      log_error ("EXPORT_NAME in clear but TLS is required; closing");
      return -1;                    /* EXPORT_NAME has no error reply */
    }
    return send_error (c, option, NBD_REP_ERR_TLS_REQD, "TLS is required: send STARTTLS");
  }
  switch (option) {
  case NBD_OPT_EXPORT_NAME:
    return opt_export_name (c, d, len);
  case NBD_OPT_ABORT:
    send_option_reply (c, option, NBD_REP_ACK, NULL, 0);
    c->read_block |= CONN_READ_CLOSING;
    return 0;
  case NBD_OPT_LIST:
    return opt_list (c, len);
  case NBD_OPT_STARTTLS:
    return opt_starttls (c, len);
  case NBD_OPT_INFO:
  case NBD_OPT_GO:
    return opt_info_go (c, option, d, len);
  case NBD_OPT_STRUCTURED_REPLY:
    if (len != 0)
      return send_error (c, option, NBD_REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
    if (cfg.no_sr)
      return send_error (c, option, NBD_REP_ERR_UNSUP, "structured replies are off (--no-sr)");
    if (c->extended)                /* no going back to 20-byte chunks */
      return send_error (c, option, NBD_REP_ERR_EXT_HEADER_REQD,
                         "extended headers are already negotiated");
    c->structured = true;
    return send_option_reply (c, option, NBD_REP_ACK, NULL, 0);
  case NBD_OPT_EXTENDED_HEADERS:
    return opt_extended_headers (c, len);
  case NBD_OPT_LIST_META_CONTEXT:
  case NBD_OPT_SET_META_CONTEXT:
    return opt_meta_context (c, option, d, len);
  default:
    return send_error (c, option, NBD_REP_ERR_UNSUP, "option not supported");
  }
}

int
handshake_consume (struct conn *c)
{
  uint8_t *in = c->rbuf + c->roff;
  size_t avail = c->rlen - c->roff;

  if (c->read_block & CONN_READ_CLOSING)
    return 0;
  if (c->phase == CONN_HS_CLIENT_FLAGS) {
    if (avail < 4)
      return 0;
    uint32_t flags = rd32 (in);
    c->roff += 4;
    /* Client flags must be among those we offered (NBD_FLAG_C_* has the
     * same bits as the global flags). */
    if (flags & ~(uint32_t) handshake_gflags ()) {
      log_error ("client sent unknown handshake flags 0x%x; closing", flags);
      return -1;
    }
    c->no_zeroes = flags & NBD_FLAG_C_NO_ZEROES;
    c->fixed_newstyle = flags & NBD_FLAG_C_FIXED_NEWSTYLE;
    c->phase = CONN_HS_OPTIONS;
    return 0;
  }

  /* Discarding an oversized option's payload. */
  if (c->discard_left) {
    size_t k = avail < c->discard_left ? avail : c->discard_left;
    c->roff += k;
    c->discard_left -= k;
    if (c->discard_left == 0)
      return send_error (c, c->skip_option, NBD_REP_ERR_TOO_BIG, "option too long");
    return 0;
  }

  if (avail < sizeof (struct nbd_option_header))
    return 0;
  uint64_t magic = rd64 (in);
  uint32_t option = rd32 (in + 8), len = rd32 (in + 12);
  if (magic != NBD_OPTS_MAGIC) {
    log_error ("bad option magic; closing");
    return -1;
  }
  if (len > MAX_OPTION_LEN) {
    if (option == NBD_OPT_EXPORT_NAME) {
      log_error ("EXPORT_NAME of %u bytes; closing", len);
      return -1;
    }
    c->roff += sizeof (struct nbd_option_header);
    c->discard_left = len;
    c->skip_option = option;
    return 0;
  }
  if (avail < sizeof (struct nbd_option_header) + len) {
    /* Make sure the whole option fits in rbuf; MAX_OPTION_LEN < RBUF. */
    return 0;
  }
  c->roff += sizeof (struct nbd_option_header) + len;
  return handle_option (c, option, in + sizeof (struct nbd_option_header), len);
}
